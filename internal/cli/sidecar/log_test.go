package sidecar

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/handoff-dev/handoff/config"
)

// The sidecar's log lines keep the keys and values zap's production logger
// wrote: level, ts (Unix seconds), logger, msg, error; info and above only;
// durations as text.
func TestLoggerWritesZapKeys(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(&buf, config.LogLevelInfo).WithValues("pod", "ns/p")
	before := time.Now()
	log.WithName("client-go").Info("started", "waited", 1500*time.Millisecond, "leases", []string{"a"})
	log.V(1).Info("debug line, not written")
	log.Error(errors.New("boom"), "failed", "addr", "127.0.0.1:1")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2 (V(1) is not written):\n%s", len(lines), buf.String())
	}
	var info, failed map[string]any
	for i, v := range []*map[string]any{&info, &failed} {
		if err := json.Unmarshal([]byte(lines[i]), v); err != nil {
			t.Fatalf("line %d is not JSON: %v\n%s", i, err, lines[i])
		}
	}
	want := map[string]any{"level": "info", "logger": "client-go", "msg": "started", "pod": "ns/p", "waited": "1.5s", "leases": []any{"a"}}
	for k, v := range want {
		if got, _ := json.Marshal(info[k]); string(got) != mustJSON(t, v) {
			t.Errorf("info line: %s = %s, want %s\n%s", k, got, mustJSON(t, v), lines[0])
		}
	}
	ts, ok := info["ts"].(float64)
	if !ok || ts < float64(before.Unix())-1 || ts > float64(time.Now().Unix())+1 {
		t.Errorf("info line: ts = %v, want the Unix time in seconds\n%s", info["ts"], lines[0])
	}
	for _, k := range []string{"time", "err"} {
		if _, ok := info[k]; ok {
			t.Errorf("info line has slog's key %q\n%s", k, lines[0])
		}
	}
	if failed["level"] != "error" || failed["error"] != "boom" || failed["msg"] != "failed" || failed["addr"] != "127.0.0.1:1" {
		t.Errorf("error line: %v, want level error, error boom, msg failed, addr", failed)
	}
}

// --log-level debug writes logr's V(1) lines, as level "debug"; error
// writes only errors.
func TestLoggerLevels(t *testing.T) {
	for level, want := range map[config.LogLevel][]string{
		config.LogLevelDebug: {"debug", "info", "error"},
		config.LogLevelInfo:  {"info", "error"},
		config.LogLevelError: {"error"},
	} {
		var buf bytes.Buffer
		log := newLogger(&buf, level)
		log.V(1).Info("debug line")
		log.V(2).Info("V(2), never written")
		log.Info("info line")
		log.Error(errors.New("boom"), "error line")
		var got []string
		for line := range strings.Lines(buf.String()) {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("%s: line is not JSON: %v\n%s", level, err, line)
			}
			got = append(got, m["level"].(string))
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("--log-level %s: levels written %v, want %v\n%s", level, got, want, buf.String())
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
