# frozen_string_literal: true

require_relative "test_helper"

class AgentTest < Minitest::Test
  def agent(**kw) = Handoff::Agent.new(insecure_no_token: true, logger: TestHelper.logger, **kw)

  def test_claims_and_stop_claiming
    a = agent
    r = a.receive
    assert_equal 1, a.receiving
    c = r.hold
    r.end
    assert_equal 1, a.in_flight
    r2 = a.receive
    st = a.stop_claiming
    assert st.stopping
    assert r2.ended?, "stop-claiming ends a pending wait"
    assert_kind_of Handoff::Stopping, r2.cause
    assert_raises(Handoff::Stopping) { a.receive }
    assert_raises(Handoff::Stopping) { a.begin_claim }
    late = r2.hold # received in the race: held, never refused
    r2.end
    assert_equal 2, a.in_flight
    refute a.wait_drained(0.05)
    c.done
    late.done
    c.done # idempotent
    assert a.wait_drained(1)
    assert a.drain_status.drained
  end

  def test_unstarted_claims_are_handed_back_at_stop_claiming
    handed = Queue.new
    a = agent(hand_back: ->(cs) { handed << cs.map(&:value) })
    r = a.receive
    started = r.hold_unstarted(:m1)
    waiting = r.hold_unstarted(:m2)
    r.end
    started.start
    assert_equal 1, a.unstarted
    a.stop_claiming
    assert_equal [:m2], handed.pop
    assert TestHelper.eventually { a.in_flight == 1 }
    assert_equal 0, a.unstarted
    assert_raises(Handoff::HandedBack) { waiting.start }
    started.done
    assert_raises(Handoff::ClaimDone) { started.start }
  end

  def test_cancel_fallback_cancels_and_waits
    calls = 0
    a = agent(return_claims: -> { calls += 1 })
    c = a.begin_claim
    worker = Thread.new do
      c.wait_canceled
      c.done
    end
    res = a.return_fallback(cancel: true, cancel_wait: 5)
    worker.join
    assert c.canceled?
    assert_kind_of Handoff::Canceled, c.cause
    assert_equal 1, res.returned
    assert a.stopping?
  end

  def test_return_claims_error_is_reported
    a = agent(return_claims: -> { raise Handoff::ReturnClaimsError.new(2, "queue down") })
    res = a.return_fallback
    assert_equal 2, res.returned
    assert_equal "queue down", res.error
  end

  # docs/protocol.md, step 4: the wait for the drain returns only once every
  # claim ended after the return has been handed back. A claim landing just
  # after the hand-back (a wait inside begin_claim) makes the Agent call
  # return_claims again; wait_drained must not report success before that
  # call has returned.
  def test_wait_drained_waits_for_the_hand_back_after_the_return
    second = Handoff::Event.new
    release = Handoff::Event.new
    calls = 0
    a = agent(return_claims: lambda {
      calls += 1
      if calls == 2
        second.set
        release.wait(10)
      end
      0
    })
    c = a.begin_claim # a wait for a message inside it: held across the return
    assert_equal 0, a.return_fallback.returned
    c.done # the message it claimed after the hand-back, given up
    drained = Queue.new
    waiter = Thread.new { drained << a.wait_drained(5) }
    assert second.wait(5), "a claim ended after the return calls return_claims again"
    assert_equal 0, a.in_flight
    refute waiter.join(0.2), "wait_drained returned while the hand-back was under way"
    release.set
    assert_equal true, drained.pop
    assert_equal 2, calls
  end

  def test_wait_drained_is_bounded_by_a_hung_hand_back
    stuck = Handoff::Event.new
    a = agent(return_claims: -> { stuck.wait(30) && 0 })
    Handoff::Agent.send(:remove_const, :CALLBACK_TIMEOUT)
    Handoff::Agent.const_set(:CALLBACK_TIMEOUT, 0.3)
    Thread.new { a.return_fallback }
    assert TestHelper.eventually { a.stopping? }
    assert_equal false, a.wait_drained(5)
  ensure
    stuck.set
    Handoff::Agent.send(:remove_const, :CALLBACK_TIMEOUT)
    Handoff::Agent.const_set(:CALLBACK_TIMEOUT, 10.0)
  end

  def test_leadership_terms_on_the_agents_clock
    clock = Handoff::Testing::FakeClock.new
    a = agent(clock: clock, lease_duration: 15)
    now = (clock.time * 1e9).to_i
    # until 5 s after receipt, validForMillis 9 s: the earlier wins
    msg = Handoff::Wire::Leadership.new(lease: "L", leader: true, sequence: now, holder_identity: "", fencing_token: 3,
                                        until_ns: now + 5_000_000_000, valid_for_millis: 9000)
    assert_nil a.genuine(msg, now)
    until_mono = [clock.monotonic + 9, clock.monotonic + 5].min
    stale, = a.apply_leadership("L", now, [3, until_mono])
    refute stale
    w = a.begin_leading("L")
    assert_equal 3, w.fencing_token
    clock.step(4.9)
    refute w.stopping?
    clock.step(0.2)
    assert w.stopping?, "the term ran out at until on the Agent's clock"
    assert_nil a.leader("L")
    assert_raises(Handoff::NotLeader) { a.begin_leading("L") }
    w.done
    stale, = a.apply_leadership("L", now, [3, until_mono + 10])
    assert stale, "a sequence not above the last applied is stale"
  end

  def test_genuine_refuses_what_the_sidecar_cannot_send
    a = agent(lease_duration: 15)
    now = (Time.now.to_f * 1e9).to_i
    lm = ->(**kw) { Handoff::Wire::Leadership.new(lease: "L", leader: true, sequence: now, holder_identity: "", fencing_token: 0, until_ns: nil, valid_for_millis: 1000, **kw) }
    assert_match(/ahead/, a.genuine(lm.call(sequence: now + 2_000_000_000), now))
    assert_match(/validForMillis/, a.genuine(lm.call(valid_for_millis: 16_000), now))
    assert_match(/until/, a.genuine(lm.call(until_ns: now + 16_000_000_000), now))
  end

  def test_serves_signed_calls
    dir = Dir.mktmpdir("rbagent", "/tmp")
    a = Handoff::Agent.new(token: TestHelper::TOKEN, logger: TestHelper.logger).start("unix://#{dir}/app.sock")
    assert_equal 0o666, File.stat("#{dir}/app.sock").mode & 0o777
    cl = Handoff::Testing::Client.new(a.url, TestHelper::TOKEN)
    status, body = cl.drain
    assert_equal 200, status
    refute body["stopping"]
    status, = Handoff::Testing::Client.new(a.url, "y" * 32).drain
    assert_equal 401, status
    c = a.begin_claim
    t0 = Handoff.monotonic
    Thread.new { sleep 0.2; c.done }
    status, body = cl.drain(5000)
    assert_equal 200, status
    assert body["drained"]
    assert_operator Handoff.monotonic - t0, :<, 3, "the long poll answers once drained"
  ensure
    a&.close
    refute File.exist?("#{dir}/app.sock")
    FileUtils.rm_rf(dir)
  end
end
