# frozen_string_literal: true

module Handoff
  # The gem's version: the installed gem's (the release builds it at the one
  # release version, HANDOFF_GEM_VERSION in handoff.gemspec), "0.0.0" from a
  # checkout.
  VERSION = Gem.loaded_specs["handoff"]&.version&.to_s || "0.0.0"
end
