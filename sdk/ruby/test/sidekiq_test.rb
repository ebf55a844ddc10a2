# frozen_string_literal: true

require_relative "sidekiq_rig"

# Handoff::Sidekiq on a real Sidekiq (Debian's ruby-sidekiq) and a real Redis,
# driven the way the sidecar drives it (signed calls on the app socket).
class SidekiqTest < Minitest::Test
  def setup
    skip "HANDOFF_BIN is not set" if TestHelper::BIN.empty?
    SidekiqRig.redis
    Sidekiq.redis(&:flushdb)
    @root = Dir.mktmpdir("rbsk", "/tmp")
    @pod = SidekiqRig::Pod.new(@root, "w", sidecar: false, env: { "HANDOFF_EXAMPLE_LEASE" => "nightly" })
    @pod.wait_ready
    @cl = @pod.client
  end

  def teardown
    @pod&.stop
    FileUtils.rm_rf(@root) if @root
  end

  def starts = SidekiqRig.events.select { |e| e["event"] == "start" }

  def test_stop_claiming_quiets_drain_follows_return_requeues
    2.times { |i| SidekiqRig.push("long#{i}", 60) }
    2.times { |i| SidekiqRig.push("short#{i}", 0.5) }
    assert TestHelper.eventually(10) { @cl.drain[1]["inFlight"] == 4 }, "4 busy jobs held"

    # Stop-claiming quiets Sidekiq: the idle processors' fetches end, nothing new starts.
    _, st = @cl.stop_claiming
    assert st["stopping"]
    assert_equal 4, st["inFlight"]
    stopped_at = Time.now.to_f
    3.times { |i| SidekiqRig.push("after#{i}", 0.1) }
    # The drain follows the busy jobs: the short ones finish, the long ones stay.
    _, st = @cl.drain(5000)
    assert TestHelper.eventually(10) { (st = @cl.drain(1000)[1])["inFlight"] == 2 && st["receiving"].zero? }, st.inspect
    refute st["drained"]
    assert_empty starts.select { |e| e["key"].start_with?("after") }, "a job started after stop-claiming"
    assert_equal 3, Sidekiq.redis { |c| c.llen("queue:#{SidekiqRig::QUEUE}") }

    # Return: the two running jobs go back on the queue, as Sidekiq's hard shutdown puts them.
    _, res = @cl.return_claims
    assert_equal 2, res["returned"]
    queued = Sidekiq.redis { |c| c.lrange("queue:#{SidekiqRig::QUEUE}", 0, -1) }.map { |j| JSON.parse(j)["args"][0] }
    assert_equal %w[after0 after1 after2 long0 long1].sort, queued.sort
    assert TestHelper.eventually(5) { @cl.drain[1]["drained"] }, "the returned jobs' threads stopped"
    _, res = @cl.return_claims
    assert_equal 0, res["returned"], "handing back again pushes nothing twice"
    assert_equal 5, Sidekiq.redis { |c| c.llen("queue:#{SidekiqRig::QUEUE}") }
    assert_empty SidekiqRig.events.select { |e| e["event"] == "applied" && e["key"].start_with?("long") }
    assert_operator starts.map { |e| e["t"] }.max, :<, stopped_at + 0.5
  end

  def test_cancel_pushes_back_the_jobs_that_stopped
    SidekiqRig.push("c0", 60)
    assert TestHelper.eventually(10) { @cl.drain[1]["inFlight"] == 1 }
    _, res = @cl.return_claims(cancel: true, cancel_wait_millis: 3000)
    assert_equal 1, res["returned"]
    assert_equal ["c0"], Sidekiq.redis { |c| c.lrange("queue:#{SidekiqRig::QUEUE}", 0, -1) }.map { |j| JSON.parse(j)["args"][0] }
    assert_equal 0, Sidekiq.redis { |c| c.zcard("retry") }, "a canceled job is pushed back, not retried"
  end

  def test_leader_work_runs_with_the_fencing_token
    now = (Time.now.to_f * 1e9).to_i
    _, ack = @cl.leadership("nightly", { "leader" => true, "sequence" => now, "fencingToken" => 7, "validForMillis" => 10_000 })
    assert_equal({ "leader" => true }, ack)
    assert TestHelper.eventually(5) { Sidekiq.redis { |c| c.get("fence:nightly") } == "7" }
    assert_equal ["w:7"], Sidekiq.redis { |c| c.lrange("leader-writes:nightly", 0, -1) }
    _, ack = @cl.leadership("nightly", { "leader" => false, "sequence" => now + 1, "fencingToken" => 0 })
    assert_equal({ "leader" => false }, ack)
    assert_equal ["w:7"], Sidekiq.redis { |c| c.lrange("leader-stopped:nightly", 0, -1) }, "acked only after the leader work stopped"
  end
end
