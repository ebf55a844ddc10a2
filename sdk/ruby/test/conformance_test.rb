# frozen_string_literal: true

require_relative "test_helper"
require "shellwords"

# handoff conformance, the repository's suite, against examples/worker.rb
# with the SDK's own fixture (Handoff::Testing: Hooks in the worker,
# Fixture as the command, examples/fixture.rb), so the suite proves the
# SDK's side of the fixture contract too. Needs HANDOFF_BIN (test.sh builds
# it); every case must pass, none skipped.
class ConformanceTest < Minitest::Test
  def test_conformance
    skip "HANDOFF_BIN is not set: build it (go build -o /tmp/handoff ./cmd/handoff)" if TestHelper::BIN.empty?

    dir = Dir.mktmpdir("rbconf", "/tmp")
    token = File.join(dir, "token")
    assert system(TestHelper::BIN, "install", "--token-file", token, out: File::NULL)
    env = { "HANDOFF_APP_URL" => "unix://#{dir}/app.sock", "HANDOFF_TOKEN_FILE" => token }
    worker = [RbConfig.ruby, File.join(TestHelper::SDK, "examples/worker.rb")].shelljoin
    fixture = [RbConfig.ruby, File.join(TestHelper::SDK, "examples/fixture.rb"), "--dir", dir, "--worker", worker].shelljoin
    out = IO.popen(env, [TestHelper::BIN, "conformance", "--fixture-cmd", fixture, "--leader-cmd", fixture, "--timeout", "4m"],
                   err: %i[child out], &:read)
    ok = $?.success?
    system(env, "#{fixture} stop")
    puts out
    m = out.match(/(\d+) passed, (\d+) failed, (\d+) skipped/)
    refute_nil m, "no summary from handoff conformance:\n#{out}"
    passed, failed, skipped = m.captures.map(&:to_i)
    log = File.exist?("#{dir}/worker.log") ? File.read("#{dir}/worker.log")[-4000..] || File.read("#{dir}/worker.log") : ""
    assert ok && failed.zero? && skipped.zero?, "#{passed} passed, #{failed} failed, #{skipped} skipped\n#{out}\nworker log:\n#{log}"
    assert_operator passed, :>=, 34
  ensure
    FileUtils.rm_rf(dir) if dir
  end
end
