# frozen_string_literal: true

require_relative "lib/handoff/version"

Gem::Specification.new do |s|
  s.name = "handoff"
  # The release builds the gem at its one version: HANDOFF_GEM_VERSION
  # (build-gem.sh passes the release's VERSION; the leading v is dropped and
  # a semver prerelease like 0.3.0-rc.1 becomes 0.3.0.pre.rc.1, as RubyGems
  # spells it). Unset or empty: Handoff::VERSION (0.0.0 from a checkout).
  v = ENV.fetch("HANDOFF_GEM_VERSION", "")
  s.version = (v.empty? ? Handoff::VERSION : v).sub(/\Av/, "").sub("-", ".pre.")
  s.summary = "The app side of the handoff protocol: graceful shutdown for Ruby queue workers on Kubernetes"
  s.description = "Serves the handoff sidecar's app API (stop-claiming, drain, return, leadership) on the pod's " \
                  "Unix socket, with signed calls, on Ruby's standard library; and Handoff::Sidekiq for Sidekiq 6."
  s.authors = ["The handoff authors"]
  s.license = "Apache-2.0"
  s.homepage = "https://github.com/handoff-dev/handoff/tree/main/sdk/ruby"
  s.metadata = { "changelog_uri" => "https://github.com/handoff-dev/handoff/blob/main/sdk/ruby/CHANGELOG.md",
                 "rubygems_mfa_required" => "true" }
  s.required_ruby_version = ">= 3.1"
  s.files = Dir["lib/**/*.rb"] + Dir["examples/*.rb"] + %w[README.md CHANGELOG.md LICENSE handoff.gemspec]
  s.require_paths = ["lib"]
  # No runtime dependency: handoff/sidekiq requires Sidekiq (6.x), which the app has.
end
