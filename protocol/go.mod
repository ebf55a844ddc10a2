module github.com/handoff-dev/handoff/protocol

go 1.24
