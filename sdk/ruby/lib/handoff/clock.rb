# frozen_string_literal: true

module Handoff
  # The Agent's clock: terms of leadership and the age of claims are timed on
  # it. {#monotonic} (seconds, never goes back), {#time} (Unix seconds, the
  # node's wall clock, which a grant's `until` and `sequence` are on) and
  # {#call_later}. Tests pass {Testing::FakeClock}.
  class RealClock
    # A scheduled callback; {#cancel} stops it.
    class Timer
      def initialize(fn)
        @fn = fn
        @mu = Mutex.new
        @cancel = Event.new
      end

      # @return [Boolean] true if it had not run yet
      def cancel
        @mu.synchronize do
          return false if @fn.nil?

          @fn = nil
        end
        @cancel.set
        true
      end

      # @api private
      def run(delay)
        Thread.new do
          @cancel.wait(delay) if delay.positive?
          fn = @mu.synchronize { f = @fn; @fn = nil; f }
          fn&.call
        end
      end
    end

    # @return [Float] seconds on a clock that never goes back
    def monotonic = Handoff.monotonic

    # @return [Float] Unix seconds
    def time = Time.now.to_f

    # Runs `fn` once `delay` seconds have passed, in a thread of its own.
    # @param delay [Numeric] seconds
    # @return [Timer]
    def call_later(delay, &fn)
      t = Timer.new(fn)
      t.run(delay.to_f)
      t
    end
  end
end
