# frozen_string_literal: true

require "socket"
require "net/http"
require "handoff"

module Handoff
  # Helpers for testing a worker built on handoff: the fixture contract of
  # `handoff conformance` ({Hooks} in the worker, {Fixture} as the command),
  # a {FakeClock}, and a signed {Client} of the app API.
  module Testing
    # The steps of `handoff conformance`'s fixtures, served by the worker on
    # a control socket (docs/protocol.md, "Checking an app"). The worker
    # passes messages whose body {#handles?} to {#handle}.
    #
    # - `hold N`: puts N messages (`conformance-held-I`) through `put` and
    #   answers once the worker works on all of them; their work ignores the
    #   cancel fallback and runs until `finish`.
    # - `hold-cancelable N`: the same (`conformance-cancelable-I`), the work
    #   ending at the cancel fallback without acknowledging.
    # - `hold-unstarted N`: holds N messages delivered to the worker (through
    #   `deliver`) unstarted, for stop-claiming to hand back.
    # - `finish`, `lead LEASE` (`yes`/`no`), `stopping LEASE` (`yes` once all
    #   leader work begun for it was told to stop, else `no`), `release LEASE`.
    # Answers are one line: `ok`, `yes`, `no`, or `error: WHY`.
    class Hooks
      # @param agent [Agent]
      # @param put [#call] `->(body) {}`: makes a message claimable in the worker's queue
      # @param deliver [#call] `->(body) { handle }`: a message claimed by this worker, not started
      def initialize(agent, put:, deliver:)
        @agent = agent
        @put = put
        @deliver = deliver
        @mu = Mutex.new
        @cv = ConditionVariable.new
        @release = Event.new
        @waiting = 0
        @leader_work = Hash.new { |h, k| h[k] = [] }
        @unstarted = []
      end

      # @return [Boolean] whether the message is the fixture's
      def handles?(body) = body.start_with?("conformance-")

      # Works on a fixture message: returns at `finish` (held) or raises at
      # the cancel fallback (cancelable: not acknowledged).
      # @raise [Canceled]
      def handle(body, claim)
        release = @mu.synchronize do
          @waiting += 1
          @cv.broadcast
          @release
        end
        if body.start_with?("conformance-cancelable-")
          claim.wait_canceled
          raise Canceled
        end
        release.wait
      end

      # Runs one step.
      # @param words [Array<String>]
      # @return [String] the answer line
      def step(words)
        cmd, arg = words
        case cmd
        when "ping" then "ok"
        when "hold" then hold("conformance-held-", Integer(arg))
        when "hold-cancelable" then hold("conformance-cancelable-", Integer(arg))
        when "hold-unstarted"
          @agent.receive do |r|
            Integer(arg).times { |i| @unstarted << r.hold_unstarted(@deliver.call("conformance-unstarted-#{i}")) }
          end
          "ok"
        when "finish"
          @mu.synchronize do
            @release.set
            @release = Event.new
          end
          @unstarted.each(&:done) # those stop-claiming did not hand back: dropped
          @unstarted.clear
          "ok"
        when "lead"
          begin
            @leader_work[arg] << @agent.begin_leading(arg)
            "yes"
          rescue NotLeader
            "no"
          end
        when "stopping"
          ws = @leader_work[arg]
          !ws.empty? && ws.all?(&:stopping?) ? "yes" : "no"
        when "release"
          @leader_work.delete(arg)&.each(&:done)
          "ok"
        else "error: unknown step #{cmd.inspect}"
        end
      rescue StandardError => e
        "error: #{e.message}"
      end

      # Serves the steps on a Unix socket, one line in, one line out.
      # @param path [String]
      # @return [UNIXServer]
      def serve(path)
        File.unlink(path) if File.exist?(path)
        srv = UNIXServer.new(path)
        Thread.new do
          loop do
            c = srv.accept
            Thread.new(c) do |conn|
              line = conn.gets.to_s.split
              conn.write("#{line.empty? ? 'error: empty step' : step(line)}\n")
            ensure
              conn.close
            end
          rescue IOError
            break
          end
        end
        srv
      end

      private

      def hold(prefix, n)
        want = @mu.synchronize { @waiting + n }
        n.times { |i| @put.call("#{prefix}#{i}") }
        deadline = Handoff.monotonic + 10
        @mu.synchronize do
          while @waiting < want
            left = deadline - Handoff.monotonic
            return "error: the worker works on #{@waiting - want + n} of the #{n} messages put" if left <= 0

            @cv.wait(@mu, left)
          end
        end
        "ok"
      end
    end

    # The fixture command of `handoff conformance` (`--fixture-cmd` and
    # `--leader-cmd`) for a worker that serves {Hooks} on `DIR/control.sock`:
    #
    #   ruby fixture.rb --dir DIR -- WORKER_COMMAND... STEP [ARG]
    #
    # `restart` stops the worker it started last and starts a fresh one
    # (WORKER_COMMAND plus `--control DIR/control.sock`, with the environment
    # given, logging to DIR/worker.log), returning once it answers; `stop`
    # stops it; every other step goes to the control socket and its `yes`/`no`
    # answer is printed. Exit status 1 on an `error:` answer.
    module Fixture
      module_function

      # @param dir [String]
      # @param worker [Array<String>] the worker's command
      # @param words [Array<String>] the step
      # @return [Integer] the exit status
      def run(dir, worker, words)
        case words[0]
        when "restart" then restart(dir, worker)
        when "stop" then stop(dir)
        else
          answer = send_step(dir, words)
          if answer.empty? || answer.start_with?("error")
            warn "#{words.join(' ')}: #{answer.empty? ? 'no answer' : answer}"
            return 1
          end
          puts answer unless answer == "ok"
        end
        0
      end

      def alive?(pid)
        File.read("/proc/#{pid}/stat").rpartition(")")[2].split[0] != "Z"
      rescue SystemCallError
        false
      end

      def stop(dir)
        pidfile = File.join(dir, "worker.pid")
        pid = Integer(File.read(pidfile)) rescue (return 0)
        [["TERM", 5.0], ["KILL", 5.0]].each do |sig, wait|
          begin
            Process.kill(sig, pid)
          rescue Errno::ESRCH
            break
          end
          deadline = Handoff.monotonic + wait
          sleep 0.01 while alive?(pid) && Handoff.monotonic < deadline
          break unless alive?(pid)
        end
        File.unlink(pidfile)
        0
      end

      def send_step(dir, words, timeout = 30)
        s = UNIXSocket.new(File.join(dir, "control.sock"))
        s.write("#{words.join(' ')}\n")
        raise Errno::ETIMEDOUT unless s.wait_readable(timeout)

        s.gets.to_s.strip
      ensure
        s&.close
      end

      def restart(dir, worker)
        stop(dir)
        ctl = File.join(dir, "control.sock")
        File.unlink(ctl) if File.exist?(ctl)
        log = File.open(File.join(dir, "worker.log"), "ab")
        pid = Process.spawn(*worker, "--control", ctl, in: File::NULL, out: log, err: log, pgroup: true)
        Process.detach(pid)
        log.close
        File.write(File.join(dir, "worker.pid"), pid.to_s)
        deadline = Handoff.monotonic + 20
        while Handoff.monotonic < deadline
          abort "worker exited: see #{File.join(dir, 'worker.log')}" unless alive?(pid)
          begin
            return 0 if send_step(dir, ["ping"], 1) == "ok"
          rescue SystemCallError
            nil
          end
          sleep 0.02
        end
        abort "worker did not answer within 20s: see #{File.join(dir, 'worker.log')}"
      end
    end

    # A clock that moves only when told ({#step}); timers run in {#step}'s thread.
    class FakeClock
      Timer = Struct.new(:clock, :key) do
        def cancel = clock.cancel(key)
      end

      # @param monotonic [Float] seconds
      # @param wall [Float, nil] Unix seconds (default now)
      def initialize(monotonic: 1000.0, wall: nil)
        @mu = Mutex.new
        @mono = monotonic
        @wall = wall || Time.now.to_f
        @pending = {}
        @seq = 0
      end

      def monotonic = @mu.synchronize { @mono }

      def time = @mu.synchronize { @wall }

      def call_later(delay, &fn)
        @mu.synchronize do
          @seq += 1
          @pending[@seq] = [@mono + [delay, 0].max, fn]
          Timer.new(self, @seq)
        end
      end

      # @api private
      def cancel(key) = @mu.synchronize { !@pending.delete(key).nil? }

      # @return [Integer] timers pending
      def timers = @mu.synchronize { @pending.size }

      # Moves both clocks on by `seconds`, then runs every timer due, in order.
      def step(seconds)
        @mu.synchronize do
          @mono += seconds
          @wall += seconds
        end
        loop do
          fn = @mu.synchronize do
            key, (_, f) = @pending.select { |_, (at, _)| at <= @mono }.min_by { |k, (at, _)| [at, k] }
            @pending.delete(key) if key
            f
          end
          break unless fn

          fn.call
        end
      end
    end

    # Makes the calls the sidecar makes, signed with the pod's token.
    class Client
      # @param url [String] the app's address
      # @param token [String]
      def initialize(url, token)
        @e = Endpoint.parse(url)
        @token = token
      end

      # One signed call.
      # @return [Array(Integer, Hash)] the status and the decoded body
      def call(method, target, body = nil, headers: {})
        raw = body.nil? ? "" : (body.is_a?(String) ? body : JSON.generate(body))
        h = Auth.sign(@token, method, target, raw).merge(headers)
        sock = @e.dial
        req = +"#{method} #{target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: #{raw.bytesize}\r\n"
        h.each { |k, v| req << "#{k}: #{v}\r\n" }
        sock.write("#{req}\r\n#{raw}")
        resp = sock.read
        head, _, rbody = resp.partition("\r\n\r\n")
        [head[/\AHTTP\/1\.1 (\d+)/, 1].to_i, rbody.empty? ? {} : JSON.parse(rbody)]
      ensure
        sock&.close
      end

      def stop_claiming = call("POST", HTTP::STOP_CLAIMING_PATH)
      def drain(wait_millis = 0) = call("GET", "#{HTTP::DRAIN_PATH}?waitMillis=#{wait_millis}")
      def return_claims(cancel: false, cancel_wait_millis: 0) = call("POST", HTTP::RETURN_PATH, { "cancel" => cancel, "cancelWaitMillis" => cancel_wait_millis })

      # @param msg [Hash] the leadership body (lease, leader, sequence, fencingToken, until, validForMillis)
      def leadership(lease, msg) = call("PUT", "#{HTTP::LEASE_PATH_PREFIX}#{lease}", { "lease" => lease }.merge(msg))
    end
  end
end
