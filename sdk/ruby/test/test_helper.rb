# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require "tmpdir"
require "socket"
require "handoff"
require "handoff/testing"

module TestHelper
  SDK = File.expand_path("..", __dir__)
  ROOT = File.expand_path("../../..", __dir__)
  BIN = ENV.fetch("HANDOFF_BIN", "")
  TOKEN = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

  module_function

  def free_port
    s = TCPServer.new("127.0.0.1", 0)
    s.addr[1]
  ensure
    s&.close
  end

  # Waits up to `timeout` seconds for the block to be truthy; its last value.
  def eventually(timeout = 5)
    deadline = Handoff.monotonic + timeout
    loop do
      v = yield
      return v if v || Handoff.monotonic > deadline

      sleep 0.01
    end
  end

  # A throwaway Redis (hack/redis.sh) for the tests of this process: its URL.
  def redis_url
    @redis_url ||= begin
      dir = Dir.mktmpdir("rbredis", "/tmp")
      addr = IO.popen({ "HANDOFF_WATCH_PID" => Process.pid.to_s }, ["bash", File.join(ROOT, "hack/redis.sh"), "start", dir, free_port.to_s],
                      err: File::NULL, &:read).strip
      raise "hack/redis.sh did not start a Redis" if addr.empty?

      Minitest.after_run do
        system("bash", File.join(ROOT, "hack/redis.sh"), "stop", dir, out: File::NULL, err: File::NULL)
        FileUtils.rm_rf(dir)
      end
      "redis://#{addr}/0"
    end
  end

  # A quiet logger for Agents in tests.
  def logger = Logger.new(File::NULL)
end
