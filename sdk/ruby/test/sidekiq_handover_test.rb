# frozen_string_literal: true

require_relative "sidekiq_rig"

# A real handover between two Sidekiq processes, each beside its own handoff
# sidecar, on a real Redis. Sidekiq A (4 threads) takes a burst, three jobs
# longer than the drain window; Sidekiq B starts and a stream of short jobs
# flows to both. Then A is shut down as the kubelet does it: handoff prestop
# on A's control socket (the sidecar stops A's claiming: Sidekiq quiets;
# drains; returns at the deadline: the running jobs are pushed back), then
# SIGTERM to A once the hook returns, SIGKILL at the grace period.
#
# Checked from the ledger the jobs write to Redis: every job applied exactly
# once (0 lost, 0 twice), A starts nothing after stop-claiming, every job A
# pushed back starts on B, and how soon (printed: jobs handed back, time to
# resume on B, p50 and max).
class SidekiqHandoverTest < Minitest::Test
  GRACE = 8.0 # terminationGracePeriodSeconds: deadline 6 s after the hook (margin 2 s), drain 4 s (reserve 2 s)
  LONG = 15.0 # longer than the burst, B's boot and the drain window: running at the deadline

  def pct(xs, p)
    s = xs.sort
    s[[s.size - 1, (p * (s.size - 1)).round].min]
  end

  def test_handover
    skip "HANDOFF_BIN is not set" if TestHelper::BIN.empty?
    SidekiqRig.redis
    Sidekiq.redis(&:flushdb)
    root = Dir.mktmpdir("rbho", "/tmp")
    pods = []
    keys = []
    rng = Random.new(23)
    a = SidekiqRig::Pod.new(root, "a", concurrency: 4, grace: "#{GRACE}s")
    pods << a
    a.wait_ready
    burst = [LONG, LONG, LONG, 0.5, 1.0] + Array.new(8) { [0.3, 0.7, 1.2, 2.0].sample(random: rng) }
    burst.each_with_index { |s, i| SidekiqRig.push("b%02d" % i, s).then { keys << "b%02d" % i } }
    assert TestHelper.eventually(10) { a.client.drain[1]["inFlight"] == 4 }, "A busy with 4 jobs"
    b = SidekiqRig::Pod.new(root, "b", concurrency: 8, grace: "#{GRACE}s")
    pods << b
    b.wait_ready
    stop = Handoff::Event.new
    stream = Thread.new do
      i = 0
      until stop.wait(0.1) # 10 jobs a second, to both
        SidekiqRig.push("s%03d" % i, [0.05, 0.1, 0.2, 0.4, 0.8].sample(random: rng))
        keys << "s%03d" % i
        i += 1
      end
    end
    sleep 1.0

    hook = Time.now.to_f
    out = a.prestop
    took = Time.now.to_f - hook
    puts "\npreStop of A (#{format('%.1f', took)}s):\n#{out}"
    a.terminate(a.worker, [0.1, hook + GRACE - Time.now.to_f].max)
    a.terminate(a.sidecar, 5.0)
    sleep 1.0
    stop.set
    stream.join

    total = -> { Sidekiq.redis { |c| c.get("total") }.to_i }
    TestHelper.eventually(40) { total.call >= keys.size && b_idle? }
    evs = SidekiqRig.events
    applied = Hash.new(0)
    evs.each { |e| applied[e["key"]] += 1 if e["event"] == "applied" }
    lost = keys.reject { |k| applied[k].positive? }
    twice = keys.select { |k| applied[k] > 1 }
    assert_empty lost, "lost"
    assert_empty twice, "applied twice"
    assert_equal keys.size, total.call

    back = evs.select { |e| e["event"] == "handed-back" }
    assert back.size >= 2 && back.all? { |e| e["worker"] == "a" }, back.inspect
    m = out.match(/return: (\d+) returned/)
    assert m && m[1].to_i == back.size, out
    quiet = evs.find { |e| e["event"] == "quiet" && e["worker"] == "a" }
    refute_nil quiet, "stop-claiming did not quiet Sidekiq A"
    # A job a processor popped just before the quiet may log its start a moment later.
    late = evs.select { |e| e["event"] == "start" && e["worker"] == "a" && e["t"] > quiet["t"] + 0.1 }
    assert_empty late, "A started jobs after stop-claiming"
    resume = back.map do |e|
      t = evs.select { |s| s["event"] == "start" && s["worker"] == "b" && s["key"] == e["key"] && s["t"] >= e["t"] - 0.001 }.map { |s| s["t"] }.min
      refute_nil t, "job #{e['key']} handed back never started on B"
      (t - e["t"]) * 1000
    end
    assert_operator resume.max, :<, 1000
    in_flight = out[/stop-claiming\s+(\d+) in flight/, 1].to_i
    puts format("handover figures: %d jobs, %d applied once, %d lost, %d applied twice\n" \
                "  A at stop-claiming: %d in flight (Sidekiq quieted: no new fetch)\n" \
                "  A at the deadline: %d running -> pushed back to Redis (as Sidekiq's hard shutdown)\n" \
                "  B started them after the hand-back: p50 %.1f ms, max %.1f ms; A started none after stop-claiming",
                keys.size, keys.count { |k| applied[k] == 1 }, lost.size, twice.size, in_flight, back.size, pct(resume, 0.5), resume.max)
  ensure
    stop&.set
    pods.each(&:stop)
    pods.each { |p| puts "--- #{p.name} worker log (tail):\n#{p.log.lines.grep_v(/brpop|Passing the timeout|sadd/).last(15).join}" } if ENV["DEBUG"]
    FileUtils.rm_rf(root) if root
  end

  # Every job B started has ended (applied, or found its key applied).
  def b_idle?
    n = 0
    SidekiqRig.events.each do |e|
      next unless e["worker"] == "b"

      n += 1 if e["event"] == "start"
      n -= 1 if %w[applied duplicate].include?(e["event"])
    end
    n.zero?
  end
end
