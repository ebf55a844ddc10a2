# frozen_string_literal: true

# An in-process queue with claims, for the example worker: a message is
# claimable, claimed (by this process) or acknowledged. `make_visible` is
# what a queue with a visibility timeout does at the drain deadline.
class MemoryQueue
  Message = Struct.new(:id, :body)

  def initialize
    @mu = Mutex.new
    @cv = ConditionVariable.new
    @ready = []
    @claimed = {}
    @seq = 0
  end

  # @return [Message] the message put
  def put(body)
    @mu.synchronize do
      @seq += 1
      m = Message.new(@seq, body)
      @ready << m
      @cv.broadcast
      m
    end
  end

  # A message claimed at once (delivered to this worker), for hold-unstarted.
  def deliver(body)
    @mu.synchronize do
      @seq += 1
      @claimed[@seq] = Message.new(@seq, body)
    end
  end

  # Claims the next message, if any.
  # @return [Message, nil]
  def try_claim
    @mu.synchronize do
      m = @ready.shift
      @claimed[m.id] = m if m
      m
    end
  end

  # @return [Boolean] false when the message was handed back meanwhile
  def ack(msg) = @mu.synchronize { !@claimed.delete(msg.id).nil? }

  # Makes claimable again every message still claimed.
  # @return [Integer] how many
  def make_visible(msgs = nil)
    @mu.synchronize do
      ids = msgs ? msgs.map(&:id) : @claimed.keys
      n = 0
      ids.each do |id|
        m = @claimed.delete(id) or next
        @ready.unshift(m)
        n += 1
      end
      @cv.broadcast
      n
    end
  end
end
