# frozen_string_literal: true

require_relative "test_helper"
require "shellwords"
require "stringio"

# Handoff::Testing's fixture, step by step: Hooks (the worker's half) and
# Fixture (the command). The whole contract is proved by the real
# `handoff conformance` in conformance_test.rb.
class FixtureTest < Minitest::Test
  def agent(**kw) = Handoff::Agent.new(insecure_no_token: true, logger: TestHelper.logger, **kw)

  # A list with a bounded take (Queue#pop(timeout:) is Ruby 3.2's).
  class List
    def initialize
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @items = []
    end

    def <<(body)
      @mu.synchronize do
        @items << body
        @cv.broadcast
      end
    end

    def take(timeout)
      @mu.synchronize do
        @cv.wait(@mu, timeout) if @items.empty?
        @items.shift
      end
    end
  end

  # A worker: three claim loops on an in-process queue, the fixture's
  # messages worked by Hooks#work.
  def worker(deliver: true)
    a = agent
    q = List.new
    canceled = Queue.new
    hooks = Handoff::Testing::Hooks.new(a, publish: ->(b) { q << b }, deliver: deliver ? ->(b) { b } : nil)
    3.times do
      Thread.new do
        loop do
          body = nil
          claim = a.receive do |r|
            body = q.take(0.05)
            body && r.hold
          end
          next unless claim

          begin
            hooks.work(body, claim)
          rescue Handoff::Canceled
            canceled << body
          ensure
            claim.done
          end
        end
      rescue Handoff::Stopping
        nil
      end
    end
    [a, hooks, canceled]
  end

  def test_hold_answers_once_the_work_runs_and_finish_ends_it
    a, hooks, = worker
    assert_equal "ok", hooks.step(%w[hold 2])
    assert_equal [2, 0], [a.in_flight, a.unstarted], "counted at the answer, not later"
    assert_equal "ok", hooks.step(%w[hold 1])
    assert_equal 3, a.in_flight
    assert_equal "ok", hooks.step(%w[finish])
    assert TestHelper.eventually { a.in_flight.zero? }
    assert_equal "ok", hooks.step(%w[hold 1]) # work held after a finish waits for the next one
    assert_equal 1, a.in_flight
    assert_equal "ok", hooks.step(%w[finish])
    assert TestHelper.eventually { a.in_flight.zero? }
  end

  def test_hold_cancelable_ends_at_the_cancel_fallback_not_at_finish
    a, hooks, canceled = worker
    assert_equal "ok", hooks.step(%w[hold-cancelable 2])
    assert_equal "ok", hooks.step(%w[hold 1])
    assert_equal "ok", hooks.step(%w[finish])
    assert TestHelper.eventually { a.in_flight == 2 }, "the held one ended; the cancelable ones wait for the cancel"
    assert canceled.empty?
    a.return_fallback(cancel: true, cancel_wait: 3)
    assert TestHelper.eventually { canceled.size == 2 && a.in_flight.zero? }
  end

  def test_hold_unstarted_and_finish_drops_those_not_handed_back
    a, hooks, = worker
    assert_equal "ok", hooks.step(%w[hold-unstarted 3])
    assert_equal [3, 3], [a.in_flight, a.unstarted]
    assert_equal "ok", hooks.step(%w[finish])
    assert_equal [0, 0], [a.in_flight, a.unstarted]
    _, plain, = worker(deliver: false)
    assert_equal "unsupported", plain.step(%w[hold-unstarted 1])
  end

  def test_bad_steps_answer_an_error
    _, hooks, = worker
    {
      %w[hold] => "error: N must be an integer >= 1, got nil",
      %w[hold x] => 'error: N must be an integer >= 1, got "x"',
      %w[hold-cancelable 0] => 'error: N must be an integer >= 1, got "0"',
      %w[lead] => "error: lead needs a Lease name",
      %w[restart] => "error: restart is the fixture command's step (Fixture.run), not the worker's",
      %w[frobnicate 1] => 'error: unknown step "frobnicate 1"',
      %w[ping] => "ok"
    }.each { |words, want| assert_equal want, hooks.step(words), words.join(" ") }
  end

  def test_lead_stopping_release
    clock = Handoff::Testing::FakeClock.new
    a = agent(clock: clock, lease_duration: 15)
    hooks = Handoff::Testing::Hooks.new(a, publish: ->(_) {})
    assert_equal "no", hooks.step(%w[lead L]), "not the leader"
    assert_equal "no", hooks.step(%w[stopping L]), "no leader work began"
    now = (clock.time * 1e9).to_i
    a.apply_leadership("L", now, [1, clock.monotonic + 2])
    assert_equal "yes", hooks.step(%w[lead L])
    assert_equal "yes", hooks.step(%w[lead L])
    assert_equal "no", hooks.step(%w[stopping L])
    clock.step(3)
    assert_equal "yes", hooks.step(%w[stopping L])
    assert_equal "ok", hooks.step(%w[release L])
    assert_equal "no", hooks.step(%w[stopping L]), "released work is forgotten"
    assert_equal "ok", hooks.step(%w[release L]), "nothing begun: nothing to do"
  end

  def test_served_and_driven_by_the_fixture_command
    dir = Dir.mktmpdir("rbfx", "/tmp")
    hooks = Handoff::Testing::Hooks.new(agent, publish: ->(_) {})
    hooks.serve(File.join(dir, "fixture.sock"))
    run = lambda do |*words|
      out = StringIO.new
      err = StringIO.new
      [Handoff::Testing::Fixture.run(dir, "unused", words, out: out, err: err), out.string, err.string]
    end
    assert_equal [0, "no\n", ""], run.call("stopping", "L")
    assert_equal [0, "", ""], run.call("release", "L"), "ok prints nothing"
    assert_equal [0, "unsupported\n", ""], run.call("hold-unstarted", "1")
    status, out, err = run.call("hold", "x")
    assert_equal [1, ""], [status, out]
    assert_includes err, "hold x: N must be an integer"
    hooks.close
    refute File.exist?(File.join(dir, "fixture.sock"))
    status, = run.call("finish")
    assert_equal 1, status, "nothing serves: a failed step"
    usage = StringIO.new
    assert_equal 2, Handoff::Testing::Fixture.main(["--dir", dir, "hold"], err: usage), "usage"
    assert_includes usage.string, "usage:"
  ensure
    FileUtils.rm_rf(dir) if dir
  end

  WORKER = <<~RUBY
    require "handoff"; require "handoff/testing"
    a = Handoff::Agent.new(insecure_no_token: true)
    a.start("unix://" + ARGV[0])
    Handoff::Testing.serve_fixture(a, publish: ->(_) {})
    sleep
  RUBY

  def test_restart_starts_a_fresh_process_and_stop_stops_it
    dir = Dir.mktmpdir("rbfx", "/tmp")
    File.write(File.join(dir, "w.rb"), WORKER)
    cmd = [RbConfig.ruby, "-I", File.join(TestHelper::SDK, "lib"), File.join(dir, "w.rb"), File.join(dir, "app.sock")].shelljoin
    pids = 2.times.map do
      err = StringIO.new
      assert_equal 0, Handoff::Testing::Fixture.run(dir, cmd, ["restart"], err: err), err.string
      assert File.exist?(File.join(dir, "app.sock")), "the app serves before the fixture answers"
      Integer(File.read(File.join(dir, "worker.pid")))
    end
    refute_equal pids[0], pids[1]
    refute Handoff::Testing::Fixture.alive?(pids[0]), "the process before is gone"
    assert_equal 0, Handoff::Testing::Fixture.run(dir, cmd, ["stop"])
    refute Handoff::Testing::Fixture.alive?(pids[1])
    err = StringIO.new
    assert_equal 1, Handoff::Testing::Fixture.run(dir, "sh -c 'exit 3'", ["restart"], err: err)
    assert_includes err.string, "exited with status 3"
  ensure
    FileUtils.rm_rf(dir) if dir
  end
end
