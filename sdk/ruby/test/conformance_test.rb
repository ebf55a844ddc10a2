# frozen_string_literal: true

require_relative "test_helper"
require "shellwords"

# handoff conformance, the repository's suite, against examples/worker.rb
# with the SDK's own fixture (Handoff::Testing: Hooks in the worker,
# Fixture as the command, examples/fixture.rb), so the suite proves the
# SDK's side of the fixture contract too. Needs HANDOFF_BIN (test.sh builds
# it); every case must pass, none skipped.
#
# With HANDOFF_SDK_GEM_HOME set to a GEM_HOME the built gem was installed in
# (test.sh does so), the worker and the fixture command are copies of the
# examples outside the tree (their `../lib` does not exist), run with
# GEM_HOME and GEM_PATH that directory and no RUBYLIB: the handoff they load
# is the installed gem's, and the test checks so first.
class ConformanceTest < Minitest::Test
  GEM_HOME = ENV.fetch("HANDOFF_SDK_GEM_HOME", "")

  def test_conformance
    skip "HANDOFF_BIN is not set: build it (go build -o /tmp/handoff ./cmd/handoff)" if TestHelper::BIN.empty?

    dir = Dir.mktmpdir("rbconf", "/tmp")
    token = File.join(dir, "token")
    assert system(TestHelper::BIN, "install", "--token-file", token, out: File::NULL)
    env = { "HANDOFF_APP_URL" => "unix://#{dir}/app.sock", "HANDOFF_TOKEN_FILE" => token }
    examples = File.join(TestHelper::SDK, "examples")
    unless GEM_HOME.empty?
      examples = File.join(dir, "app")
      FileUtils.mkdir_p(examples)
      FileUtils.cp(%w[worker.rb memory_queue.rb fixture.rb].map { |f| File.join(TestHelper::SDK, "examples", f) }, examples)
      env.merge!("GEM_HOME" => GEM_HOME, "GEM_PATH" => GEM_HOME, "RUBYLIB" => nil, "RUBYOPT" => nil)
      puts "installed handoff: #{installed_files(env, examples).join(" ")}"
    end
    worker = [RbConfig.ruby, File.join(examples, "worker.rb")].shelljoin
    fixture = [RbConfig.ruby, File.join(examples, "fixture.rb"), "--dir", dir, "--worker", worker].shelljoin
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

  # The files of handoff and handoff/testing a ruby in env loads from the
  # directory `app`, after checking they are the installed gem's in GEM_HOME.
  def installed_files(env, app)
    out = IO.popen(env, [RbConfig.ruby, "-e", <<~'RUBY', app], chdir: app, err: %i[child out], &:read)
      $LOAD_PATH.unshift(File.expand_path("../lib", ARGV[0])) # as the copied examples do: no such directory
      require "handoff"
      require "handoff/testing"
      puts $LOADED_FEATURES.grep(%r{/handoff(/testing)?\.rb\z})
    RUBY
    assert $?.success?, "ruby with GEM_HOME=#{GEM_HOME} does not load handoff:\n#{out}"
    files = out.split("\n")
    assert_equal 2, files.size, out
    files.each { |f| assert f.start_with?(File.join(GEM_HOME, "gems", "handoff-")), "handoff loaded from #{f}, not the gem in #{GEM_HOME}" }
    files
  end
end
