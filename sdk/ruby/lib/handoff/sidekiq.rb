# frozen_string_literal: true

require "handoff"
require "sidekiq"

module Handoff
  # Handoff for Sidekiq (6.x, the process `sidekiq` runs), loaded in the
  # server with `-r`:
  #
  #   # config/handoff.rb, run as: sidekiq -r ./config/handoff.rb
  #   require "handoff/sidekiq"
  #   Handoff::Sidekiq.install
  #
  # What the sidecar's sequence does to the process:
  # - **stop-claiming** quiets it as Sidekiq's own TSTP does (`Launcher#quiet`:
  #   no processor fetches a new job; one a fetch returns after it is pushed
  #   back by Sidekiq itself), before the answer;
  # - the **drain** follows the busy jobs: each job runs inside a claim held
  #   by a server middleware (`inFlight` is the busy jobs), and the fetches
  #   still blocked in BRPOP count as `receiving` until each processor has
  #   stopped or taken its last job;
  # - **return** (and cancel, after its wait) puts the unfinished jobs back
  #   on their queues as Sidekiq's hard shutdown does (RPUSH of the job's
  #   payload: the next fetch takes it first) and stops their threads
  #   (`Sidekiq::Shutdown`), so the job is not acknowledged here; after the
  #   return, a job that ends without finishing is pushed back too;
  # - **cancel** sets {.canceled?} for the jobs: a job that checks it and
  #   raises {Handoff::Canceled} is pushed back, not retried;
  # - **leader work** runs with the term's fencing token: {.lead}.
  # Sidekiq's own SIGTERM shutdown then finds nothing busy.
  module Sidekiq
    # One busy job: its claim, Sidekiq's unit of work, whether it was pushed back.
    Busy = Struct.new(:claim, :queue, :jobstr, :requeued, :thread)

    class << self
      # @return [Agent, nil] the Agent, once the server has started
      attr_reader :agent

      # Installs the integration: the server middleware, and the Agent
      # started at Sidekiq's startup, serving $HANDOFF_APP_URL.
      # @param url [String, nil] the app's address (default $HANDOFF_APP_URL)
      # @param on_requeue [#call, nil] `->(jobs, at) {}`: called after the return
      #   pushed jobs back, with their payloads (Array<Hash>) and the Unix time
      #   in seconds (Float) just before the push, in the Agent's thread
      # @param agent_options [Hash] passed to {Agent#initialize} (token_file:, lease_duration:, logger:)
      # @return [void]
      def install(url: nil, on_requeue: nil, **agent_options)
        @on_requeue = on_requeue
        ::Sidekiq.configure_server do |config|
          config.server_middleware { |chain| chain.add(Middleware) }
          # At :startup the CLI has not made its launcher yet: it is looked up at stop-claiming.
          config.on(:startup) { start(-> { ::Sidekiq::CLI.instance.launcher }, url: url, **agent_options) }
        end
      end

      # Starts the Agent for a Sidekiq server (called by {.install}).
      # @param launcher [#call] `-> { ::Sidekiq::Launcher }`: the process's launcher
      # @return [Agent]
      def start(launcher, url: nil, **agent_options)
        @launcher = launcher
        @mu = Mutex.new
        @busy = {}     # Thread => Busy
        @unacked = []  # Busy ended without finishing after the return began
        @agent = Agent.new(logger: ::Sidekiq.logger, **agent_options,
                           return_claims: method(:return_claims), on_stop_claiming: method(:quiet))
        # The processors' fetch loops: one wait pending until stop-claiming
        # has quieted them and each has stopped or taken its last job.
        @fetching = @agent.receive
        @agent.start(url)
        ::Sidekiq.logger.info("handoff: serving #{@agent.url}, instance #{@agent.instance}")
        @agent
      end

      # @return [Boolean] whether the sidecar's cancel fallback canceled the current job
      def canceled?
        b = @mu&.synchronize { @busy[Thread.current] }
        !b.nil? && b.claim.canceled?
      end

      # Runs leader work for `lease` while this process leads it, again at
      # each new term, in a thread: the block gets the {LeaderWork} (its
      # `fencing_token`, `stopping?`) and returns when the term ends.
      # @return [Thread]
      def lead(lease, &block)
        Thread.new do
          until @agent.stopping? && @agent.leader(lease).nil?
            changed = @agent.leadership_changed
            begin
              @agent.begin_leading(lease, &block)
            rescue NotLeader
              changed.wait(1.0)
            end
          end
        end
      end

      # @api private
      # The middleware's hold: a job fetched is held even after stop-claiming.
      def hold(queue, jobstr)
        b = Busy.new(@fetching.hold, queue, jobstr, false, Thread.current)
        @mu.synchronize { @busy[Thread.current] = b }
        b
      end

      # @api private
      # The job is over: finished (acknowledged or retried by Sidekiq), or not.
      def release(b, finished)
        @mu.synchronize do
          @busy.delete(b.thread)
          @unacked << b if !finished && !b.requeued
        end
        b.claim.done
      end

      private

      def quiet
        ::Sidekiq.logger.info("handoff: stop-claiming: quieting Sidekiq (no new fetch)")
        launcher = @launcher.call
        launcher.quiet
        Thread.new { follow_fetches(launcher) }
      end

      # Ends the pending wait once every processor has stopped (Sidekiq
      # removes it from the manager) or holds the job it fetched last.
      def follow_fetches(launcher)
        loop do
          workers = launcher.manager.workers.to_a
          busy = @mu.synchronize { @busy.keys }
          break if workers.all? { |p| p.thread.nil? || !p.thread.alive? || busy.include?(p.thread) }

          sleep 0.01
        end
        @fetching.end
      end

      # Pushes back every unfinished job, as Sidekiq's hard shutdown does,
      # and stops the threads running them; safe to repeat.
      def return_claims
        items = @mu.synchronize do
          xs = @busy.values.reject(&:requeued) + @unacked
          @unacked = []
          xs.each { |b| b.requeued = true }
          xs
        end
        return 0 if items.empty?

        at = Time.now.to_f
        ::Sidekiq.redis do |conn|
          conn.pipelined do |pipe|
            items.each { |b| pipe.rpush("queue:#{b.queue}", b.jobstr) }
          end
        end
        items.each { |b| b.thread.raise(::Sidekiq::Shutdown) if b.thread.alive? && @mu.synchronize { @busy[b.thread].equal?(b) } }
        ::Sidekiq.logger.info("handoff: pushed #{items.size} jobs back to Redis")
        begin
          @on_requeue&.call(items.map { |b| ::Sidekiq.load_json(b.jobstr) }, at)
        rescue StandardError => e
          ::Sidekiq.logger.error("handoff: on_requeue: #{e.class}: #{e.message}")
        end
        items.size
      end
    end

    # The server middleware: each job runs inside a claim.
    class Middleware
      def call(_worker, job, queue)
        b = Sidekiq.hold(queue, ::Sidekiq.dump_json(job))
        finished = false
        begin
          yield
          finished = true
        rescue Handoff::Canceled
          raise ::Sidekiq::Shutdown # not retried: pushed back by the return
        rescue StandardError
          finished = true # a failure: Sidekiq's retry takes the job
          raise
        ensure
          Sidekiq.release(b, finished)
        end
      end
    end
  end
end
