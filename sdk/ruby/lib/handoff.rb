# frozen_string_literal: true

require "json"
require "uri"

# The app side of the handoff protocol (docs/protocol.md) for Ruby workers,
# on the standard library alone: {Handoff::Agent} serves the app API on the
# pod's Unix socket, checks every call's signature with the pod's token, and
# keeps the worker's claims, stop-claiming, the drain, the return and cancel
# fallbacks and the terms of leadership.
module Handoff
end

require_relative "handoff/version"
require_relative "handoff/errors"
require_relative "handoff/event"
require_relative "handoff/config"
require_relative "handoff/auth"
require_relative "handoff/wire"
require_relative "handoff/endpoint"
require_relative "handoff/clock"
require_relative "handoff/agent"
require_relative "handoff/http"
