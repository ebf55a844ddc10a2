#!/usr/bin/env ruby
# frozen_string_literal: true

# The fixture command of `handoff conformance` (--fixture-cmd and
# --leader-cmd) for a worker that serves Handoff::Testing::Hooks
# (Handoff::Testing.serve_fixture), such as examples/worker.rb:
#
#   ruby fixture.rb --dir DIR --worker 'ruby worker.rb' STEP [ARG]
#
# restart starts a fresh worker, stop stops it, the other steps go to it.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "handoff/testing"

exit Handoff::Testing::Fixture.main(ARGV)
