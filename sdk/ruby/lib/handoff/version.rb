# frozen_string_literal: true

module Handoff
  # The gem's version; the release sets it from the one release version
  # (hack/release.sh), as for the Python and Node packages.
  VERSION = "0.0.0"
end
