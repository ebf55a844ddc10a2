#!/usr/bin/env ruby
# frozen_string_literal: true

# The fixture command of `handoff conformance` for examples/worker.rb
# (--fixture-cmd and --leader-cmd):
#
#   ruby fixture.rb --dir DIR STEP [ARG]
#
# Handoff::Testing::Fixture: restart starts a fresh worker.rb, stop stops it,
# the other steps go to its control socket DIR/control.sock.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "handoff/testing"

args = ARGV.dup
dir = nil
worker = [RbConfig.ruby, File.expand_path("worker.rb", __dir__)]
while args[0]&.start_with?("--")
  case args.shift
  when "--dir" then dir = args.shift
  when "--worker" then worker = [RbConfig.ruby, args.shift]
  else abort "fixture.rb: unknown option"
  end
end
abort "usage: fixture.rb --dir DIR [--worker W.rb] restart|stop|hold N|hold-cancelable N|hold-unstarted N|finish|lead L|stopping L|release L" if dir.nil? || args.empty?
exit Handoff::Testing::Fixture.run(dir, worker, args)
