# frozen_string_literal: true

module Handoff
  # The base of the Agent's errors.
  class Error < StandardError; end

  # Claiming has stopped: raised by {Agent#receive} and {Agent#begin_claim}
  # from stop-claiming on; the cause of a {Receive} it ended.
  class Stopping < Error
    def initialize(msg = "handoff: claiming has stopped") = super
  end

  # The cause of a {Claim} canceled by the sidecar's `cancel` fallback at the drain deadline.
  class Canceled < Error
    def initialize(msg = "handoff: in-flight work canceled at the drain deadline") = super
  end

  # Raised by {Claim#start} for an unstarted claim that stop-claiming took to
  # hand back: drop the message (the Agent ends the claim).
  class HandedBack < Error
    def initialize(msg = "handoff: unstarted claim handed back at stop-claiming") = super
  end

  # Raised by {Claim#start} after {Claim#done}.
  class ClaimDone < Error
    def initialize(msg = "handoff: claim is done") = super
  end

  # Raised by {Agent#begin_leading} when this worker does not lead the Lease
  # (or its term has run out).
  class NotLeader < Error
    def initialize(msg = "handoff: not the leader of this Lease") = super
  end

  # The Agent cannot start: no token, an unreadable or bad token file, a bad
  # lease duration or address. The message names the setting and the
  # accepted form.
  class ConfigError < Error; end

  # An address {Endpoint.parse} refused, or a socket that cannot be served.
  class EndpointError < ConfigError; end

  # Raise it from a `return_claims` callback that handed back some claims and
  # failed on others: {#returned} is how many it handed back; the message goes
  # to the sidecar as the ReturnResult's `error`. Any other exception counts
  # as 0 handed back.
  class ReturnClaimsError < Error
    # @return [Integer] how many claims were handed back before the failure
    attr_reader :returned

    # @param returned [Integer] claims handed back
    # @param msg [String] why the rest were not
    def initialize(returned, msg)
      super(msg)
      @returned = returned
    end
  end
end
