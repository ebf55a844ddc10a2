# frozen_string_literal: true

module Handoff
  # A one-way flag threads wait on (Python's threading.Event): {#set} wakes
  # every waiter and stays set.
  class Event
    def initialize
      @mu = Mutex.new
      @cv = ConditionVariable.new
      @set = false
    end

    # Sets the flag and wakes every waiter. Idempotent.
    # @return [void]
    def set
      @mu.synchronize do
        @set = true
        @cv.broadcast
      end
    end

    # @return [Boolean] whether {#set} was called
    def set?
      @set
    end

    # Waits until set, or `timeout` seconds (nil: no bound).
    # @param timeout [Numeric, nil] seconds
    # @return [Boolean] whether the flag is set
    def wait(timeout = nil)
      return true if @set

      deadline = timeout && (Handoff.monotonic + timeout)
      @mu.synchronize do
        until @set
          if deadline
            left = deadline - Handoff.monotonic
            break if left <= 0

            @cv.wait(@mu, left)
          else
            @cv.wait(@mu)
          end
        end
        @set
      end
    end
  end

  # Seconds on a clock that never goes back.
  # @return [Float]
  def self.monotonic
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end
end
