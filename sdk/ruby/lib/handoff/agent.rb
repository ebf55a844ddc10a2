# frozen_string_literal: true

require "logger"
require "securerandom"

module Handoff
  # One term as leader of a Lease, as the sidecar told it. `fencing_token`
  # grows with each new holder: pass it to what leader work writes to.
  # `until_mono` is when the term ends unless renewed, in seconds on the
  # Agent's monotonic clock: the earlier of the grant's `until` and its
  # receipt plus `validForMillis`.
  Term = Struct.new(:lease, :fencing_token, :until_mono)

  # One message the worker holds, from {Receive#hold}, {Receive#hold_unstarted}
  # or {Agent#begin_claim}, until {#done}.
  class Claim
    # @return [Object, nil] the value given to {Receive#hold_unstarted}
    attr_reader :value
    # @return [Exception, nil] a {Canceled} once the cancel fallback canceled the work
    attr_reader :cause
    # @api private
    attr_accessor :state, :taken, :started_at

    # @api private
    def initialize(agent, value, state)
      @agent = agent
      @value = value
      @state = state
      @taken = false
      @started_at = nil
      @canceled = Event.new
      @cause = nil
    end

    # Starts an unstarted claim: from now on stop-claiming leaves it to drain.
    # Does nothing for a claim started already.
    # @raise [HandedBack] stop-claiming took it to hand back (drop the message)
    # @raise [ClaimDone] after {#done}
    # @return [void]
    def start = @agent.__send__(:start_claim, self)

    # The claim is over: finished, or handed back. Idempotent. From the return
    # fallback on, each claim ended makes the Agent call `return_claims` again.
    # @return [void]
    def done = @agent.__send__(:end_claim, self, false)

    # @return [Boolean] whether the claim is over
    def done? = @agent.__send__(:claim_done?, self)

    # @return [Boolean] whether the sidecar's cancel fallback canceled the work (not at stop-claiming)
    def canceled? = @canceled.set?

    # Waits up to `timeout` seconds for the cancel fallback.
    # @param timeout [Numeric, nil] seconds, nil: no bound
    # @return [Boolean] whether it was canceled
    def wait_canceled(timeout = nil) = @canceled.wait(timeout)

    # @api private
    def cancel!
      return if @canceled.set?

      @cause = Canceled.new
      @canceled.set
    end
  end

  # One wait for messages, pending (not in flight, not drained either) until
  # {#end}. Wait for messages with {#wait}, which stop-claiming cuts off, and
  # {#hold} every message received, even after stop-claiming.
  class Receive
    # @return [Exception, nil] a {Stopping} once stop-claiming ended the wait
    attr_reader :cause

    # @api private
    def initialize(agent)
      @agent = agent
      @ended = Event.new
      @closed = false
      @cause = nil
    end

    # One message received: held, started and in flight until {Claim#done}. Never refuses.
    # @return [Claim]
    def hold = @agent.__send__(:hold, Agent::STARTED, nil)

    # One message received and not started (the rest of a batch, a prefetch),
    # with the app's handle `value`: at stop-claiming the Agent hands it back
    # through `hand_back`.
    # @return [Claim]
    def hold_unstarted(value = nil) = @agent.__send__(:hold, Agent::UNSTARTED, value)

    # Waits up to `timeout` seconds for the wait to end (stop-claiming, or {#end}).
    # @return [Boolean] whether it has ended
    def wait(timeout = nil) = @ended.wait(timeout)

    # @return [Boolean] whether stop-claiming or {#end} ended the wait
    def ended? = @ended.set?

    # The wait is over: call it once the messages received are held, or when none came. Idempotent.
    # @return [void]
    def end = @agent.__send__(:end_receive, self)

    # @api private
    def stop!
      return if @ended.set?

      @cause = Stopping.new
      @ended.set
    end

    # @api private
    def close!
      return false if @closed

      @closed = true
      @ended.set
      true
    end
  end

  # Leader work begun by {Agent#begin_leading}: stop when {#stopping?}; call
  # {#done} when over (a block does): the revoke is acked only after that.
  class LeaderWork
    # @return [Term]
    attr_reader :term

    # @api private
    def initialize(agent, tstate)
      @agent = agent
      @tstate = tstate
      @term = tstate.lead
      @done = false
    end

    # @return [String]
    def lease = term.lease

    # @return [Integer] the term's fencing token: pass it to what the leader writes to
    def fencing_token = term.fencing_token

    # @return [Boolean] whether the term has ended (revoked, replaced, or run out)
    def stopping? = @tstate.stop.set?

    # Waits up to `timeout` seconds for the term to end.
    # @return [Boolean] whether it has
    def wait(timeout = nil) = @tstate.stop.wait(timeout)

    # The leader work is over; idempotent.
    # @return [void]
    def done = @agent.__send__(:leader_work_done, self, @tstate)

    # @api private
    def done_flag = @done

    # @api private
    def done_flag! = (@done = true)
  end

  # The worker's end of the handoff protocol (Go: `worker.Agent`). Thread-safe.
  #
  #   agent = Handoff::Agent.new(return_claims: -> { queue.make_visible_all })
  #   agent.start # serves $HANDOFF_APP_URL, calls checked with $HANDOFF_TOKEN_FILE's token
  #   loop do
  #     r = agent.receive # raises Handoff::Stopping once claiming has stopped
  #     msg = queue.poll until msg || r.wait(0.1)
  #     claim = msg && r.hold
  #     r.end
  #     next unless claim
  #     begin handle(msg) ensure claim.done end
  #   end
  class Agent
    STARTED = 0
    UNSTARTED = 1
    HANDED_BACK = 2
    DONE = 3
    # Seconds {#wait_drained} waits for one `return_claims` call after the
    # return fallback began, from the call's start (a thread is not stopped).
    CALLBACK_TIMEOUT = 10.0

    # @api private
    TermState = Struct.new(:lead, :ended, :stop, :timer, :timer_gen, :work, :changed)

    # @return [String] this process's name in the drain status: 16 random hex digits
    attr_reader :instance
    # @return [Logger]
    attr_reader :logger
    # @api private
    attr_reader :verifier, :clock, :mu

    # @param return_claims [#call, nil] `-> { Integer }`: hands back every
    #   claim held and not finished (makes them claimable again) and returns
    #   how many; called at the drain deadline and again after each claim
    #   ended from then on, one call at a time. Must be safe to repeat. Raise
    #   {ReturnClaimsError} for a partial hand-back.
    # @param hand_back [#call, nil] `->(claims) { }`: hands back claims held
    #   unstarted (Array<Claim>, {Claim#value} tells which messages); called at
    #   stop-claiming in a thread of the Agent's; raising leaves them to the
    #   return fallback.
    # @param token [String, nil] the pod's token; default the file `token_file` or $HANDOFF_TOKEN_FILE names
    # @param insecure_no_token [Boolean] serve without a token (local development only)
    # @param lease_duration [Numeric, nil] seconds: the longest grant accepted; default $HANDOFF_LEASE_DURATION, else 1h
    # @param on_stop_claiming [#call, nil] `-> {}`: called once, at
    #   stop-claiming (or the return fallback when stop-claiming never came),
    #   before it is answered: stop the queue client's fetching there (the
    #   Sidekiq integration quiets the process). Keep it short: the sidecar
    #   bounds stop-claiming by 1 s. This SDK's choice; the wire is the same.
    # @param clock [RealClock, Testing::FakeClock]
    # @raise [ConfigError] no token, a bad token file or lease duration
    def initialize(return_claims: nil, hand_back: nil, token: nil, token_file: nil, insecure_no_token: false,
                   lease_duration: nil, clock: nil, logger: nil, on_stop_claiming: nil)
      tok = Config.agent_token(token, token_file, insecure_no_token)
      @max_term = Config.lease_duration(lease_duration)
      @clock = clock || RealClock.new
      @logger = logger || Logger.new($stderr, progname: "handoff", level: Logger::INFO)
      @verifier = tok && Auth::Verifier.new(tok)
      @return_claims_fn = return_claims
      @hand_back_fn = hand_back
      @on_stop_claiming = on_stop_claiming
      @instance = SecureRandom.hex(8)
      @mu = Mutex.new
      @turn = Mutex.new # held by whoever calls return_claims
      @stopped = false
      @stopping = Event.new
      @held = 0
      @unstarted = 0
      @to_hand_back = []
      @handing_back = false
      @failed = []
      @returned = false
      @return_again = false
      @returning_again = false
      @returning = 0
      @call_started = nil
      @receives = {}
      @claims = {}
      @changed = Event.new
      @work_canceled = false
      @leases = {}
      @replaced = {}
      @sequences = {}
      @lchanged = Event.new
      @server = nil
    end

    # ---- the worker's API -------------------------------------------------

    # Begins a wait for messages.
    # @yieldparam r [Receive] ended when the block returns
    # @return [Receive, Object] the Receive, or the block's value
    # @raise [Stopping] once the worker must stop claiming
    def receive
      r = Receive.new(self)
      @mu.synchronize do
        raise Stopping if @stopped

        @receives[r] = true
        changed_locked
      end
      return r unless block_given?

      begin
        yield r
      ensure
        r.end
      end
    end

    # Holds one claim at once, for work claimed the moment it begins; a wait
    # inside it counts as in flight and is not ended by stop-claiming.
    # @yieldparam claim [Claim] done when the block returns
    # @return [Claim, Object]
    # @raise [Stopping] once stopping
    def begin_claim
      c = @mu.synchronize do
        raise Stopping if @stopped

        hold_locked(STARTED, nil)
      end
      return c unless block_given?

      begin
        yield c
      ensure
        c.done
      end
    end

    # @return [Boolean] whether the worker must stop claiming (stop-claiming, or the return fallback)
    def stopping? = @stopping.set?

    # Waits up to `timeout` seconds for stop-claiming.
    # @return [Boolean] whether claiming has stopped
    def wait_stopping(timeout = nil) = @stopping.wait(timeout)

    # @return [Integer] claims held (started or not)
    def in_flight = @mu.synchronize { @held }

    # @return [Integer] claims held unstarted, or taken to hand back and not yet ended
    def unstarted = @mu.synchronize { @unstarted }

    # @return [Integer] waits for a message pending
    def receiving = @mu.synchronize { @receives.size }

    # @return [Wire::DrainStatus] the drain status as the sidecar reads it
    def drain_status = @mu.synchronize { status_locked }

    # Waits up to `timeout` seconds (nil: no bound) for the drain; the worker
    # may exit once it returns true.
    #
    # Drained is no claim held and no receive pending; from the return
    # fallback on it also waits for the `return` call to be answered and for
    # every `return_claims` call due since (one after each claim ended) to
    # return (docs/protocol.md, step 4).
    # @param timeout [Numeric, nil] seconds
    # @return [Boolean] true once drained; false when `timeout` passes first,
    #   or, with nothing held, when a `return_claims` call has run for
    #   {CALLBACK_TIMEOUT} (10 s) without returning (logged)
    def wait_drained(timeout = nil)
      deadline = timeout && (Handoff.monotonic + timeout)
      loop do
        done, changed, at_most = wait_drained_step(CALLBACK_TIMEOUT)
        return done unless done.nil?

        left = deadline && (deadline - Handoff.monotonic)
        return false if left && left <= 0

        left = left ? [left, at_most].min : at_most if at_most
        changed.wait(left)
      end
    end

    # Stops claiming: ends every pending receive (cause {Stopping}), refuses
    # new ones, and hands back the claims held unstarted through `hand_back`
    # in the background. Idempotent.
    # @return [Wire::DrainStatus] the status when claiming stopped
    def stop_claiming
      st = @mu.synchronize do
        return status_locked if @stopped

        @stopped = true
        @stopping.set
        @receives.each_key(&:stop!)
        @logger.info(format("stop claiming: inFlight=%d unstarted=%d receiving=%d", @held, @unstarted, @receives.size))
        s = status_locked
        take_locked(@claims.keys.select { |c| c.state == UNSTARTED })
        s
      end
      begin
        @on_stop_claiming&.call
      rescue StandardError => e
        @logger.error("on_stop_claiming failed: #{e.class}: #{e.message}")
      end
      st
    end

    # The drain deadline's fallback (Go: `Agent.Return`): stops claiming; with
    # `cancel`, cancels every claim ({Claim#canceled?}) and waits up to
    # `cancel_wait` seconds for the drain; then calls `return_claims` once any
    # call under way has returned. From then on each claim the app ends makes
    # the Agent call `return_claims` again.
    # @param cancel [Boolean]
    # @param cancel_wait [Numeric] seconds
    # @return [Wire::ReturnResult] this call's count and error
    def return_fallback(cancel: false, cancel_wait: 0.0)
      @mu.synchronize { @returning += 1 }
      begin
        stop_claiming
        if cancel
          cancel_work
          wait_claims([cancel_wait.to_f, 0.0].max)
        end
        @turn.lock
        n, err = call_return_claims
        if @return_claims_fn
          if err.empty?
            @logger.info("claims returned: #{n} (cancel=#{cancel})")
          else
            @logger.error("returning claims failed (returned #{n}, cancel=#{cancel}): #{err}")
          end
        end
        Wire::ReturnResult.new(n, err)
      ensure
        @mu.synchronize do
          @returning -= 1
          changed_locked
        end
      end
    end

    # The current term for `lease`.
    # @return [Term, nil] nil when this worker does not lead it or the term has run out
    def leader(lease)
      @mu.synchronize do
        t = @leases[lease]
        t && live_locked(t) ? t.lead : nil
      end
    end

    # The terms led now among `names` (every one, sorted, with none).
    # @return [Array<Term>]
    def leading(*names)
      @mu.synchronize do
        ns = names.empty? ? @leases.keys.sort : names
        ns.filter_map { |n| (t = @leases[n]) && live_locked(t) ? t.lead : nil }
      end
    end

    # An {Event} set at the next change of the Leases led (a term begun or ended).
    # @return [Event]
    def leadership_changed = @mu.synchronize { @lchanged }

    # Begins leader work for `lease`; the revoke is acked only once every
    # piece has called {LeaderWork#done} (a block does).
    # @yieldparam work [LeaderWork]
    # @return [LeaderWork, Object]
    # @raise [NotLeader] when this worker does not lead it
    def begin_leading(lease)
      w = @mu.synchronize do
        t = @leases[lease]
        raise NotLeader if t.nil? || !live_locked(t)

        t.work += 1
        LeaderWork.new(self, t)
      end
      return w unless block_given?

      begin
        yield w
      ensure
        w.done
      end
    end

    # Serves the app API in background threads on `url` (default
    # $HANDOFF_APP_URL). A socket is made at the path with mode 0666.
    # @param url [String, nil] `unix:///path` or `http://127.0.0.1:PORT` (port 0 picks one)
    # @return [self]
    # @raise [EndpointError]
    def start(url = nil)
      raise Error, "handoff: the Agent is serving already" if @server

      @server = HTTP::Server.new(self, Endpoint.app(url))
      @server.start
      self
    end

    # @return [String] the address served (with the port picked for port 0); "" when not serving
    def url = @server ? @server.url : ""

    # Stops serving and removes the socket; the worker's state is kept.
    # @return [void]
    def close
      s = @server
      @server = nil
      s&.close
    end

    # ---- for the server ---------------------------------------------------

    # @api private
    # Why a leadership message cannot come from the sidecar (answered 422), or nil.
    def genuine(msg, received_wall_ns)
      seq = msg.sequence
      if seq > received_wall_ns && seq - received_wall_ns > MAX_SEQUENCE_AHEAD_NS
        return format("body: sequence %d is %.3fs ahead of this process's clock; want a sequence (the send time in Unix " \
                      "nanoseconds) at most 1s ahead", seq, (seq - received_wall_ns) / 1e9)
      end
      return nil unless msg.leader

      max_ms = (@max_term * 1000).to_i
      if msg.valid_for_millis > max_ms
        return format("body: validForMillis %d is longer than the lease duration %gs, which bounds every term the sidecar " \
                      "grants; want at most %d", msg.valid_for_millis, @max_term, max_ms)
      end
      if msg.until_ns && msg.until_ns - received_wall_ns > (@max_term * 1e9).to_i
        return format("body: until is %.3fs after receipt, longer than the lease duration %gs, which bounds every term the " \
                      "sidecar grants; want an until at most %gs ahead", (msg.until_ns - received_wall_ns) / 1e9, @max_term, @max_term)
      end
      nil
    end

    # @api private
    # Applies one message about `lease` if it is the latest.
    # @return [Array(Boolean, Array<TermState>)] stale, and the terms a revoke waits for
    def apply_leadership(lease, seq, grant)
      @mu.synchronize do
        last = @sequences[lease]
        return [true, []] if last && seq <= last

        @sequences[lease] = seq
        if grant
          grant_locked(lease, grant[0], grant[1])
          return [false, []]
        end
        [false, end_term_locked(lease)]
      end
    end

    # @api private
    # The leader work still running in `terms`, and an Event set when it goes down.
    def leader_work_left(terms)
      @mu.synchronize do
        terms.each do |t|
          return [terms.sum(&:work), t.changed] if t.work.positive?
        end
        [0, nil]
      end
    end

    # @api private
    def drained_and_changed = @mu.synchronize { [drained_locked, @changed] }

    private

    def changed_locked
      @changed.set
      @changed = Event.new
    end

    def lchanged_locked
      @lchanged.set
      @lchanged = Event.new
    end

    def hold(state, value)
      @mu.synchronize do
        c = hold_locked(state, value)
        take_locked([c]) if state == UNSTARTED && @stopped
        c
      end
    end

    def hold_locked(state, value)
      c = Claim.new(self, value, state)
      c.started_at = @clock.monotonic if state == STARTED
      c.cancel! if @work_canceled
      @held += 1
      @claims[c] = true
      @unstarted += 1 if state == UNSTARTED
      changed_locked
      c
    end

    def start_claim(c)
      @mu.synchronize do
        raise HandedBack if c.taken

        if c.state == UNSTARTED
          c.state = STARTED
          c.started_at = @clock.monotonic
          @unstarted -= 1
          changed_locked
        elsif c.state == DONE
          raise ClaimDone
        end
      end
    end

    def claim_done?(c) = @mu.synchronize { c.state == DONE }

    def end_claim(c, by_agent)
      @mu.synchronize do
        prev = c.state
        return if prev == DONE || c.taken != by_agent

        c.state = DONE
        @unstarted -= 1 if [UNSTARTED, HANDED_BACK].include?(prev)
        @claims.delete(c)
        @held -= 1
        changed_locked
        # Past the drain deadline's hand-back the queue may still have this
        # message claimed (received after it, or given up): hand back again.
        return_again_locked if @returned && !by_agent && @return_claims_fn
      end
    end

    def end_receive(r)
      @mu.synchronize do
        next unless r.close!

        @receives.delete(r)
        changed_locked
      end
    end

    def drained_locked = @held.zero? && @receives.empty?

    def status_locked
      oldest = @claims.keys.select { |c| c.state == STARTED && c.started_at }.map(&:started_at).min
      running = oldest ? [((@clock.monotonic - oldest) * 1000).to_i, 0].max : 0
      Wire::DrainStatus.new(stopping: @stopped, in_flight: @held, unstarted: @unstarted, receiving: @receives.size,
                            running_millis: running, drained: drained_locked, instance: @instance)
    end

    def wait_drained_step(bound)
      drained, changed, started, settled = @mu.synchronize do
        [drained_locked, @changed, @call_started, @returning.zero? && !@returning_again]
      end
      return [true, changed, nil] if drained && settled

      if drained && started
        left = started + bound - Handoff.monotonic
        if left <= 0
          @logger.error("wait for the drain: return_claims, called after the return fallback began, did not return " \
                        "within #{bound}s; what it has not handed back waits for its visibility timeout")
          return [false, changed, nil]
        end
        return [nil, changed, left]
      end
      [nil, changed, nil]
    end

    def wait_claims(timeout)
      deadline = Handoff.monotonic + timeout
      loop do
        drained, changed = drained_and_changed
        left = deadline - Handoff.monotonic
        return if drained || left <= 0

        changed.wait(left)
      end
    end

    def cancel_work
      @mu.synchronize do
        @work_canceled = true
        @claims.each_key(&:cancel!)
      end
    end

    def take_locked(claims)
      return if @hand_back_fn.nil? || claims.empty?

      claims.each do |c|
        c.state = HANDED_BACK
        c.taken = true
      end
      @to_hand_back.concat(claims)
      return if @handing_back

      @handing_back = true
      Thread.new { hand_back_loop }
    end

    def hand_back_loop
      loop do
        claims = @mu.synchronize do
          cs = @to_hand_back
          @to_hand_back = []
          @handing_back = false if cs.empty?
          cs
        end
        return if claims.empty?

        begin
          @hand_back_fn.call(claims)
        rescue StandardError => e
          @logger.error("hand back of #{claims.size} unstarted claims failed; left to the drain deadline's fallback: #{e.message}")
          @mu.synchronize do
            @failed.concat(claims)
            return_again_locked if @returned
          end
          next
        end
        @logger.info("unstarted claims handed back: #{claims.size}")
        claims.each { |c| end_claim(c, true) }
      end
    end

    # Calls return_claims (the caller holds @turn, which this releases), then
    # ends the failed hand-backs.
    def call_return_claims
      failed = @mu.synchronize do
        @returned = true
        @return_again = false
        f = @failed
        @failed = []
        @call_started = Handoff.monotonic
        changed_locked
        f
      end
      n = 0
      err = ""
      begin
        n = Integer(@return_claims_fn.call) if @return_claims_fn
      rescue ReturnClaimsError => e
        n = e.returned
        err = e.message
      rescue StandardError => e
        err = e.message.empty? ? e.class.name : e.message
      ensure
        @mu.synchronize do
          @call_started = nil
          changed_locked
        end
        @turn.unlock
      end
      failed.each { |c| end_claim(c, true) }
      [n, err]
    end

    def return_again_locked
      @return_again = true
      return if @returning_again

      @returning_again = true
      Thread.new { return_again_loop }
    end

    def return_again_loop
      loop do
        @turn.lock
        wanted = @mu.synchronize do
          if @return_again
            true
          else
            @returning_again = false
            changed_locked
            false
          end
        end
        unless wanted
          @turn.unlock
          return
        end
        n, err = call_return_claims
        next unless @return_claims_fn

        if err.empty?
          @logger.info("claims returned again after the drain deadline: #{n}")
        else
          @logger.error("returning claims again after the drain deadline failed (returned #{n}): #{err}")
        end
      end
    end

    # ---- leadership ----

    def live_locked(t) = !t.ended && @clock.monotonic < t.lead.until_mono

    def leader_work_done(w, t)
      @mu.synchronize do
        return if w.done_flag

        w.done_flag!
        t.work -= 1
        t.changed.set
        t.changed = Event.new
      end
    end

    def schedule_end_locked(t)
      t.timer&.cancel
      t.timer_gen += 1
      gen = t.timer_gen
      t.timer = @clock.call_later(t.lead.until_mono - @clock.monotonic) { term_ran_out(t, gen) }
    end

    def term_ran_out(t, gen)
      @mu.synchronize do
        next if t.timer_gen != gen || t.ended

        t.ended = true
        t.stop.set
        lchanged_locked
      end
    end

    def grant_locked(lease, token, until_mono)
      t = @leases[lease]
      if t && (t.lead.fencing_token != token || t.ended)
        stop_term_locked(t)
        old = (@replaced[lease] || []).select { |o| o.work.positive? }
        old << t if t.work.positive?
        @replaced[lease] = old
        t = nil
      end
      lead = Term.new(lease, token, until_mono)
      if t.nil?
        t = TermState.new(lead, false, Event.new, nil, 0, 0, Event.new)
        @leases[lease] = t
        @logger.info("leading #{lease}: fencingToken=#{token}")
        lchanged_locked
      end
      t.lead = lead
      schedule_end_locked(t)
    end

    def stop_term_locked(t)
      if t.timer
        t.timer.cancel
        t.timer_gen += 1
      end
      return false if t.ended

      t.ended = true
      t.stop.set
      true
    end

    def end_term_locked(lease)
      t = @leases[lease]
      terms = (@replaced.delete(lease) || []).select { |o| o.work.positive? }
      return terms if t.nil?

      lchanged_locked if stop_term_locked(t)
      terms + [t]
    end
  end
end
