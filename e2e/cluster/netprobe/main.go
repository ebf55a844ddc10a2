// Command netprobe is the e2e cluster's network probe: a pod that tries an
// HTTP GET to another pod on request, so that a test sees what a
// NetworkPolicy lets through from this pod's address. It serves, on :8080:
//
//	GET /get?url=http://IP:PORT/PATH
//
// and answers 200 with "open: " and the status line the target gave
// ("open: 200 OK"), or with "closed: " and the error when the target could
// not be reached within 2 s (refused, reset, timed out: what a policy that
// drops or rejects shows). Only http:// URLs to an IP address are taken;
// anything else is 400. The test
// reaches netprobe through the API server's pod proxy, which comes from the
// node, so the probe's own ingress policies do not stand in its way.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	client := &http.Client{Timeout: 2 * time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /get", func(w http.ResponseWriter, r *http.Request) {
		target := r.URL.Query().Get("url")
		u, err := url.Parse(target)
		if err != nil || u.Scheme != "http" || net.ParseIP(u.Hostname()) == nil || u.Port() == "" || len(target) > 256 {
			http.Error(w, fmt.Sprintf("url %q: want http://IP:PORT/PATH, at most 256 bytes", target), http.StatusBadRequest)
			return
		}
		resp, err := client.Get(u.String())
		if err != nil {
			_, _ = fmt.Fprint(w, "closed: ", err)
			return
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		_ = resp.Body.Close()
		_, _ = fmt.Fprint(w, "open: ", resp.Status)
	})
	srv := &http.Server{Addr: ":8080", Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		stop()
		fmt.Fprintln(os.Stderr, "netprobe:", err)
		os.Exit(1) //nolint:gocritic // stop ran above
	}
}
