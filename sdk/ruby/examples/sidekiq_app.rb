# frozen_string_literal: true

# A Sidekiq app with handoff, as a pod's worker container runs it:
#
#   HANDOFF_TOKEN_FILE=... HANDOFF_APP_URL=unix:///handoff-run/app.sock \
#     sidekiq -r ./examples/sidekiq_app.rb -q handoff-example
#
# HandoffExample::Work applies a job once: it records its start, works for
# the seconds given (stopping early at the cancel fallback), then applies
# its key once (a dedup key in Redis: a job pushed back while it ran and run
# again elsewhere finds it). With $HANDOFF_EXAMPLE_LEASE it does leader work
# under that Lease, writing the term's fencing token to Redis only where it
# is not older than the last written (a fenced write).

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "json"
require "handoff/sidekiq"

# Debian's redis-rb 4.8 warns of calls Sidekiq 6.4 makes; nothing to act on here.
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

# on_requeue records the jobs the return pushed back, for the handover test's figures.
Handoff::Sidekiq.install(on_requeue: lambda { |jobs, at|
  Sidekiq.redis do |c|
    jobs.each { |j| HandoffExample.event(c, event: "handed-back", key: j["args"][0], jid: j["jid"], t: at) }
  end
})

module HandoffExample
  WORKER = ENV.fetch("WORKER_NAME", "worker")

  def self.event(conn, **e)
    conn.rpush("events", JSON.generate({ worker: WORKER, t: Time.now.to_f }.merge(e)))
  end

  # args: key (String), seconds (Float)
  class Work
    include Sidekiq::Worker
    sidekiq_options queue: "handoff-example", retry: 3

    def perform(key, seconds)
      Sidekiq.redis { |c| HandoffExample.event(c, event: "start", key: key, jid: jid) }
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds.to_f
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        raise Handoff::Canceled if Handoff::Sidekiq.canceled?

        sleep 0.02
      end
      Sidekiq.redis do |c|
        if c.set("applied:#{key}", WORKER, nx: true)
          c.incr("total")
          HandoffExample.event(c, event: "applied", key: key, jid: jid)
        else
          HandoffExample.event(c, event: "duplicate", key: key, jid: jid)
        end
      end
    end
  end

  # The fenced write: the token is stored only if not older than the stored one.
  FENCED_SET = <<~LUA
    local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
    if tonumber(ARGV[1]) < cur then return 0 end
    redis.call('SET', KEYS[1], ARGV[1])
    redis.call('RPUSH', KEYS[2], ARGV[2])
    return 1
  LUA
end

# Sidekiq fires :quiet when stop-claiming quiets it: recorded for the tests.
Sidekiq.configure_server do |config|
  config.on(:quiet) { Sidekiq.redis { |c| HandoffExample.event(c, event: "quiet", key: "") } }
end

if (lease = ENV["HANDOFF_EXAMPLE_LEASE"])
  Sidekiq.configure_server do |config|
    config.on(:startup) do
      Handoff::Sidekiq.lead(lease) do |work|
        Sidekiq.logger.info("leading #{lease} with fencing token #{work.fencing_token}")
        Sidekiq.redis do |c|
          c.eval(HandoffExample::FENCED_SET, keys: ["fence:#{lease}", "leader-writes:#{lease}"],
                                             argv: [work.fencing_token, "#{HandoffExample::WORKER}:#{work.fencing_token}"])
        end
        nil until work.wait(0.2)
        Sidekiq.redis { |c| c.rpush("leader-stopped:#{lease}", "#{HandoffExample::WORKER}:#{work.fencing_token}") }
      end
    end
  end
end
