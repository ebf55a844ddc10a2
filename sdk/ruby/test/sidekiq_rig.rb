# frozen_string_literal: true

require_relative "test_helper"
require "sidekiq"
require "json"

# "Pods" for the Sidekiq tests: a Sidekiq process running
# examples/sidekiq_app.rb (Handoff::Sidekiq) and, optionally, a real handoff
# sidecar beside it as plain processes, sockets in a directory of their own
# (as sdk/python's Celery tests and make demo run them: no Kubernetes API,
# the drain deadline from HANDOFF_GRACE_PERIOD).
module SidekiqRig
  APP = File.join(TestHelper::SDK, "examples/sidekiq_app.rb")
  QUEUE = "handoff-example"
  KUBECONFIG = <<~YAML
    apiVersion: v1
    kind: Config
    clusters:
    - name: none
      cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
    users:
    - name: none
      user: {token: none}
    contexts:
    - name: none
      context: {cluster: none, user: none}
    current-context: none
  YAML

  def self.redis
    Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)
    Sidekiq.configure_client { |c| c.redis = { url: TestHelper.redis_url } }
    Sidekiq.logger.level = Logger::WARN
  end

  def self.push(key, seconds)
    Sidekiq::Client.push("class" => "HandoffExample::Work", "queue" => QUEUE, "args" => [key, seconds])
  end

  def self.events
    Sidekiq.redis { |c| c.lrange("events", 0, -1) }.map { |e| JSON.parse(e) }
  end

  class Pod
    attr_reader :name, :dir, :token, :app_url, :control, :worker, :sidecar

    def initialize(root, name, concurrency: 4, grace: "8s", sidecar: true, env: {})
      @name = name
      @dir = File.join(root, name)
      FileUtils.mkdir_p(@dir)
      @token = File.join(@dir, "token")
      raise "handoff install failed" unless system(TestHelper::BIN, "install", "--token-file", @token, out: File::NULL)

      @app_url = "unix://#{@dir}/app.sock"
      @control = "unix://#{@dir}/control.sock"
      base = { "HANDOFF_TOKEN_FILE" => @token, "HANDOFF_APP_URL" => @app_url, "HANDOFF_LEASE_DURATION" => nil, "HANDOFF_SHARDS" => nil }
      if sidecar
        kc = File.join(root, "kubeconfig")
        File.write(kc, KUBECONFIG) unless File.exist?(kc)
        senv = base.merge("HANDOFF_CONTROL_ADDR" => @control, "HANDOFF_POD_NAME" => name, "HANDOFF_POD_NAMESPACE" => "default",
                          "HANDOFF_KUBECONFIG" => kc, "HANDOFF_METRICS_ADDR" => "127.0.0.1:0", "HANDOFF_GRACE_PERIOD" => grace)
        @sidecar = Process.spawn(senv, TestHelper::BIN, "sidecar", out: File.join(@dir, "sidecar.log"), err: %i[child out], pgroup: true)
      end
      wenv = base.merge("REDIS_URL" => TestHelper.redis_url, "WORKER_NAME" => name).merge(env)
      @worker = Process.spawn(wenv, "sidekiq", "-r", APP, "-c", concurrency.to_s, "-q", QUEUE, "-t", "25",
                              out: File.join(@dir, "worker.log"), err: %i[child out], pgroup: true, chdir: TestHelper::SDK)
    end

    def log = File.exist?("#{@dir}/worker.log") ? File.read("#{@dir}/worker.log", mode: "rb") : ""

    def client = Handoff::Testing::Client.new(@app_url, File.read(@token).strip)

    def wait_ready(timeout = 30)
      ok = TestHelper.eventually(timeout) do
        raise "worker #{name} exited:\n#{log[-3000..]}" if Process.waitpid(@worker, Process::WNOHANG)

        File.socket?("#{@dir}/app.sock") && log.include?("handoff: serving")
      end
      raise "worker #{name} not ready in #{timeout}s:\n#{log[-3000..]}" unless ok
    end

    # The kubelet's preStop hook: handoff prestop, blocking until the sidecar's sequence is over.
    def prestop(timeout = "30s")
      out = IO.popen([TestHelper::BIN, "prestop", "--addr", @control, "--token-file", @token, "--timeout", timeout], err: %i[child out], &:read)
      raise "prestop of #{name}: #{$?.exitstatus}\n#{out}" unless $?.success?

      out
    end

    # SIGTERM, then SIGKILL after `kill_after` seconds (the grace period); the exit status.
    def terminate(pid, kill_after)
      return nil if pid.nil?

      begin
        Process.kill("TERM", pid)
      rescue Errno::ESRCH
        nil
      end
      deadline = Handoff.monotonic + kill_after
      while Handoff.monotonic < deadline
        _, st = Process.waitpid2(pid, Process::WNOHANG)
        return st if st

        sleep 0.02
      end
      Process.kill("KILL", -pid)
      Process.waitpid2(pid)[1]
    rescue Errno::ECHILD, Errno::ESRCH
      nil
    end

    def stop
      [@worker, @sidecar].compact.each do |pid|
        Process.kill("KILL", -pid)
        Process.waitpid(pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
    end
  end
end
