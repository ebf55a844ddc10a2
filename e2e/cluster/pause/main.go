// Command pause is the e2e cluster's sandbox image: it blocks until it is
// told to stop, as the pause container of a pod does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
