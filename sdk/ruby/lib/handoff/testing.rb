# frozen_string_literal: true

require "socket"
require "net/http"
require "handoff"

module Handoff
  # Helpers for testing a worker built on handoff: the fixture contract of
  # `handoff conformance` ({Hooks} in the worker, {Fixture} as the command;
  # between them a Unix socket, one line in and one out, the same in every
  # SDK), a {FakeClock}, and a signed {Client} of the app API.
  module Testing
    # The environment variable naming the worker's fixture socket, set by
    # {Fixture}'s `restart`.
    FIXTURE_SOCKET_ENV = "HANDOFF_FIXTURE_SOCKET"
    # Every body the fixture puts in the queue begins with it ({Hooks#handles?}).
    FIXTURE_PREFIX = "conformance-"
    # Seconds `hold N` waits for the worker to work on the N messages put.
    HOLD_TIMEOUT = 20

    # The worker's half of the fixture contract of `handoff conformance`
    # (docs/protocol.md, "The fixture contract"): the steps, served on the
    # Unix socket $HANDOFF_FIXTURE_SOCKET ({#serve}, {Testing.serve_fixture})
    # once the Agent serves. The worker gives only `publish` (puts a
    # message with that body in its queue, where its claim loops claim it)
    # and, optionally, `deliver` (a message claimed by this worker at once,
    # as a broker pushes one to a prefetching consumer; without it
    # `hold-unstarted` answers `unsupported` and its case is skipped), and
    # passes each message whose body {#handles?} to {#work}, with its claim
    # held started, acknowledging the message when {#work} returns.
    #
    # - `hold N`: puts N messages and answers once the worker works on all
    #   N; that work ignores the cancel fallback and returns at `finish`.
    # - `hold-cancelable N`: the same, the work raising {Canceled} once the
    #   cancel fallback cancels the claim (leave the message unacknowledged).
    # - `hold-unstarted N`: holds N delivered messages unstarted, for
    #   stop-claiming to hand back.
    # - `finish`: the held work returns; the unstarted claims stop-claiming
    #   did not hand back are dropped.
    # - `lead LEASE` (`yes`/`no`), `stopping LEASE` (`yes` once all the
    #   leader work begun for it and not released was told to stop, else
    #   `no`), `release LEASE` (ends that leader work, forgotten from then).
    # - `ping`: `ok` ({Fixture}'s `restart` waits for it).
    # Each step is answered once done, in one line: `ok`, `yes`, `no`,
    # `unsupported`, or `error: WHY`.
    class Hooks
      # @param agent [Agent]
      # @param publish [#call] `->(body) {}`: makes a message claimable in the worker's queue
      # @param deliver [#call, nil] `->(body) { message }`: a message claimed by this worker, not started
      # @param put [#call, nil] the former name of `publish`
      def initialize(agent, publish: nil, deliver: nil, put: nil)
        raise ArgumentError, "Hooks: publish is required (->(body) { queue.put(body) })" if (publish || put).nil?

        @agent = agent
        @publish = publish || put
        @deliver = deliver
        @mu = Mutex.new
        @cv = ConditionVariable.new
        @release = Event.new
        @working = 0
        @seq = 0
        @leader_work = Hash.new { |h, k| h[k] = [] }
        @unstarted = []
        @server = nil
      end

      # @return [Boolean] whether the message is the fixture's, for {#work}
      def handles?(body) = body.start_with?(FIXTURE_PREFIX)

      # Works on a fixture message: returns at `finish`; raises {Canceled}
      # once the cancel fallback cancels `claim` (a `hold-cancelable` one).
      # @param claim [Claim]
      # @raise [Canceled]
      def work(body, claim)
        release = @mu.synchronize do
          @working += 1
          @cv.broadcast
          @release
        end
        if body.start_with?("#{FIXTURE_PREFIX}cancelable-")
          claim.wait_canceled
          raise Canceled
        end
        release.wait
      end
      alias handle work

      # Runs one step.
      # @param words [Array<String>]
      # @return [String] the answer line
      def step(words)
        cmd, arg = words
        case cmd
        when "ping" then "ok"
        when "hold" then hold("held-", count(arg))
        when "hold-cancelable" then hold("cancelable-", count(arg))
        when "hold-unstarted"
          n = count(arg)
          return "unsupported" if @deliver.nil?

          @agent.receive do |r|
            n.times { @unstarted << r.hold_unstarted(@deliver.call(body("unstarted-"))) }
          end
          "ok"
        when "finish"
          unstarted = @mu.synchronize do
            @release.set
            @release = Event.new
            @unstarted.slice!(0..)
          end
          unstarted.each(&:done) # those stop-claiming did not hand back: dropped
          "ok"
        when "lead", "stopping", "release" then leader(cmd, arg)
        when "restart" then "error: restart is the fixture command's step (Fixture.run), not the worker's"
        else "error: unknown step #{words.join(' ').inspect}"
        end
      rescue StandardError => e
        "error: #{e.message}"
      end

      # Serves the steps on a Unix socket, one connection a step.
      # @param path [String] default $HANDOFF_FIXTURE_SOCKET
      # @return [String] the path
      # @raise [ArgumentError] with no path
      def serve(path = ENV.fetch(FIXTURE_SOCKET_ENV, ""))
        raise ArgumentError, "Hooks#serve: no path given and #{FIXTURE_SOCKET_ENV} is not set" if path.to_s.empty?

        File.unlink(path) if File.exist?(path)
        srv = UNIXServer.new(path)
        @server = [srv, path]
        Thread.new do
          loop do
            c = srv.accept
            Thread.new(c) do |conn|
              line = conn.gets.to_s.split
              conn.write("#{line.empty? ? 'error: empty step' : step(line)}\n")
            rescue SystemCallError, IOError
              nil
            ensure
              conn.close
            end
          rescue IOError, SystemCallError
            break
          end
        end
        path
      end

      # Stops serving and removes the socket.
      def close
        srv, path = @server
        return unless srv

        @server = nil
        srv.close
        File.unlink(path) if File.exist?(path)
      end

      private

      def count(arg)
        n = Integer(arg, exception: false)
        raise ArgumentError, "N must be an integer >= 1, got #{arg.inspect}" if n.nil? || n < 1

        n
      end

      def body(kind)
        @mu.synchronize { "#{FIXTURE_PREFIX}#{kind}#{Process.pid}-#{@seq += 1}" }
      end

      def hold(kind, n)
        want = @mu.synchronize { @working + n }
        n.times { @publish.call(body(kind)) }
        deadline = Handoff.monotonic + HOLD_TIMEOUT
        @mu.synchronize do
          while @working < want
            left = deadline - Handoff.monotonic
            return "error: the worker works on #{n - (want - @working)} of the #{n} messages put after #{HOLD_TIMEOUT}s" if left <= 0

            @cv.wait(@mu, left)
          end
        end
        "ok"
      end

      def leader(cmd, lease)
        raise ArgumentError, "#{cmd} needs a Lease name" if lease.to_s.empty?

        case cmd
        when "lead"
          begin
            w = @agent.begin_leading(lease)
          rescue NotLeader
            return "no"
          end
          @mu.synchronize { @leader_work[lease] << w }
          "yes"
        when "stopping"
          ws = @mu.synchronize { @leader_work.fetch(lease, []).dup }
          !ws.empty? && ws.all?(&:stopping?) ? "yes" : "no"
        else
          @mu.synchronize { @leader_work.delete(lease) }&.each(&:done)
          "ok"
        end
      end
    end

    # {Hooks} served on $HANDOFF_FIXTURE_SOCKET, or nil when it is not set
    # (not under `handoff conformance`). Call it once the Agent serves.
    # @return [Hooks, nil]
    def self.serve_fixture(agent, publish:, deliver: nil)
      return nil if ENV.fetch(FIXTURE_SOCKET_ENV, "").empty?

      h = Hooks.new(agent, publish: publish, deliver: deliver)
      h.serve
      h
    end

    # The fixture command of `handoff conformance` (`--fixture-cmd` and
    # `--leader-cmd`) for a worker that serves {Hooks}:
    #
    #   ruby -rhandoff/testing -e 'exit Handoff::Testing::Fixture.main(ARGV)' -- \
    #     --dir DIR --worker 'WORKER COMMAND' STEP [ARG]
    #
    # DIR is the command's own: the worker's pid file, its log
    # (DIR/worker.log) and its socket (DIR/fixture.sock). `restart` kills
    # the worker it started last (SIGKILL, as a container is killed) and
    # starts a fresh one (`sh -c 'exec WORKER COMMAND'`, with the
    # environment given and $HANDOFF_FIXTURE_SOCKET set, stdin /dev/null),
    # returning once its socket answers; `stop` stops it (TERM, then KILL
    # after 5 s); every other step goes to the socket, and its `yes`, `no`
    # or `unsupported` is printed. Exit status 1, with the reason on
    # standard error, when a step fails.
    module Fixture
      ONE_WORD = %w[restart finish stop].freeze
      TWO_WORDS = %w[hold hold-cancelable hold-unstarted lead stopping release].freeze
      USAGE = "usage: --dir DIR --worker 'WORKER COMMAND' restart|stop|hold N|hold-cancelable N|hold-unstarted N|finish|lead L|stopping L|release L"

      module_function

      # The command line: parses `--dir`, `--worker` and the step.
      # @param argv [Array<String>]
      # @return [Integer] the exit status (2: usage)
      def main(argv, out: $stdout, err: $stderr)
        args = argv.dup
        dir = worker = nil
        while args[0]&.start_with?("--")
          case args.shift
          when "--dir" then dir = args.shift
          when "--worker" then worker = args.shift
          else
            err.puts(USAGE)
            return 2
          end
        end
        ok = (ONE_WORD.include?(args[0]) && args.size == 1) || (TWO_WORDS.include?(args[0]) && args.size == 2)
        unless dir && worker && ok
          err.puts(USAGE)
          return 2
        end
        run(dir, worker, args, out: out, err: err)
      end

      # Runs one step.
      # @param dir [String]
      # @param worker [String, Array<String>] the worker's command: a shell command line, or its words
      # @param words [Array<String>] the step
      # @return [Integer] the exit status
      def run(dir, worker, words, out: $stdout, err: $stderr)
        case words[0]
        when "restart" then restart(dir, worker)
        when "stop" then stop(dir, graceful: true)
        else
          answer = send_step(dir, words)
          case answer
          when "ok" then nil
          when "yes", "no", "unsupported" then out.puts(answer)
          else raise answer.empty? ? "no answer" : answer.delete_prefix("error: ")
          end
        end
        0
      rescue StandardError => e
        err.puts("handoff fixture #{words.join(' ')}: #{e.message}")
        1
      end

      def alive?(pid)
        File.read("/proc/#{pid}/stat").rpartition(")")[2].split[0] != "Z"
      rescue SystemCallError
        false
      end

      def stop(dir, graceful:)
        pidfile = File.join(dir, "worker.pid")
        pid = Integer(File.read(pidfile)) rescue (return 0)
        (graceful ? [["TERM", 5.0], ["KILL", 5.0]] : [["KILL", 5.0]]).each do |sig, wait|
          begin
            Process.kill(sig, -pid) # the worker leads its own group: its children too
          rescue Errno::ESRCH
            break
          end
          deadline = Handoff.monotonic + wait
          sleep 0.01 while alive?(pid) && Handoff.monotonic < deadline
          break unless alive?(pid)
        end
        raise "worker #{pid} still running 5s after SIGKILL" if alive?(pid)

        File.unlink(pidfile)
        0
      end

      def send_step(dir, words, timeout = 60)
        s = UNIXSocket.new(File.join(dir, "fixture.sock"))
        s.write("#{words.join(' ')}\n")
        raise Errno::ETIMEDOUT, "no answer within #{timeout}s" unless s.wait_readable(timeout)

        s.gets.to_s.strip
      ensure
        s&.close
      end

      def restart(dir, worker, start_timeout = 20)
        stop(dir, graceful: false)
        sock = File.join(dir, "fixture.sock")
        File.unlink(sock) if File.exist?(sock)
        log_path = File.join(dir, "worker.log")
        argv = worker.is_a?(Array) ? worker : ["/bin/sh", "-c", "exec #{worker}"]
        pid = File.open(log_path, "ab") do |log|
          Process.spawn({ FIXTURE_SOCKET_ENV => sock }, *argv, in: File::NULL, out: log, err: log, pgroup: true)
        end
        waiter = Process.detach(pid)
        File.write(File.join(dir, "worker.pid"), pid.to_s)
        deadline = Handoff.monotonic + start_timeout
        while Handoff.monotonic < deadline
          raise "the worker exited with status #{waiter.value.exitstatus} at start: see #{log_path}" unless waiter.alive?

          begin
            return 0 if send_step(dir, ["ping"], 1) == "ok"
          rescue SystemCallError
            nil
          end
          sleep 0.01
        end
        raise "the worker did not answer on #{sock} within #{start_timeout}s: see #{log_path}"
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
