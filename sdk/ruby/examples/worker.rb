#!/usr/bin/env ruby
# frozen_string_literal: true

# An example queue worker on the handoff Agent: a few threads each run the
# claim loop (receive, wait for a message, cut off at stop-claiming; hold
# it; work; acknowledge; done). At the drain deadline the sidecar's return
# fallback makes every message still claimed visible again. With
# `--lease NAME` (or $HANDOFF_SHARDS) it also does leader work, fenced.
#
#   HANDOFF_TOKEN_FILE=token HANDOFF_APP_URL=unix:///tmp/w/app.sock ruby worker.rb
#
# Under `handoff conformance` ($HANDOFF_FIXTURE_SOCKET set by its fixture
# command, examples/fixture.rb) it serves the fixture's steps
# (Handoff::Testing.serve_fixture): a test hook.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "optparse"
require "handoff"
require "handoff/testing"
require_relative "memory_queue"

opts = { concurrency: 4, leases: [] }
OptionParser.new do |o|
  o.on("--concurrency N", Integer) { |v| opts[:concurrency] = v }
  o.on("--lease NAME") { |v| opts[:leases] << v }
end.parse!

queue = MemoryQueue.new
agent = Handoff::Agent.new(return_claims: -> { queue.make_visible }, hand_back: ->(claims) { queue.make_visible(claims.map(&:value)) })
agent.start
# Under handoff conformance only: nil otherwise.
fixture = Handoff::Testing.serve_fixture(agent, publish: ->(b) { queue.put(b) }, deliver: ->(b) { queue.deliver(b) })

consume = lambda do
  loop do
    msg = nil
    claim = agent.receive do |r|
      # Poll until a message comes or stop-claiming ends the wait: the claim
      # runs while the receive is pending, so one taken in the race is held.
      msg = queue.try_claim until msg || r.wait(0.05)
      msg && r.hold # held from here, even after stop-claiming
    end
    next unless claim

    begin
      if fixture&.handles?(msg.body)
        fixture.work(msg.body, claim) # until finish; raises Handoff::Canceled: left claimed
      else
        puts "message #{msg.id}: #{msg.body}"
      end
      warn "message #{msg.id} finished after it was handed back" unless queue.ack(msg)
    rescue StandardError => e
      warn "message #{msg.id} not finished (#{e.message}): left claimed, handed back at the deadline"
    ensure
      claim.done
    end
  end
rescue Handoff::Stopping
  nil # claiming has stopped: what is held drains
end

lead = lambda do |lease|
  loop do
    changed = agent.leadership_changed
    agent.begin_leading(lease) do |work|
      agent.logger.info("leading #{lease} with fencing token #{work.fencing_token}")
      nil until work.wait(1.0) # leader-only work, its writes fenced by work.fencing_token
    end
  rescue Handoff::NotLeader
    changed.wait(5.0)
  end
end

opts[:concurrency].times { Thread.new(&consume) }
(opts[:leases].empty? ? Handoff.shards_from_env : opts[:leases]).each { |l| Thread.new { lead.call(l) } }
agent.logger.info("serving #{agent.url}, instance #{agent.instance}")

done = Queue.new
%w[TERM INT].each { |s| Signal.trap(s) { done << s } }
done.pop
# SIGTERM comes after the sidecar's sequence has drained or handed back.
agent.wait_drained(10)
agent.close
fixture&.close
exit!(0)
