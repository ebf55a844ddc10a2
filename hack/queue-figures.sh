#!/usr/bin/env bash
# Prints, for each queue system with an adapter in worker/ and a real server
# here, the time for an unfinished claim to be claimed again by another
# worker after a leaving worker's drain deadline: with the adapter (its hand
# back at the deadline) and without it (the queue's own timeout), from one
# run of bench/queues/<queue> each, which starts its own server. The runs'
# details go to stderr.
#
# Usage: make queue-figures   (or QUEUES="jetstream river" hack/queue-figures.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
queues=${QUEUES:-$(cd bench/queues && ls -d */ | tr -d / | tr '\n' ' ')}
echo "queue | with adapter | without (queue's own timeout) | ratio"
status=0
for q in $queues; do
  if ! row=$(go run "./bench/queues/$q" | tail -1); then
    echo "$q | failed (see stderr) | - | -"
    status=1
    continue
  fi
  echo "$row"
done
exit $status
