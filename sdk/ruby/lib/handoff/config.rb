# frozen_string_literal: true

module Handoff
  # The environment variable naming the pod's token file.
  TOKEN_FILE_ENV = "HANDOFF_TOKEN_FILE"
  # The token file in an injected pod.
  TOKEN_FILE = "/handoff-bin/token"
  # The environment variable with the sidecar's lease duration (a Go duration).
  LEASE_DURATION_ENV = "HANDOFF_LEASE_DURATION"
  # The environment variable with the pod's shard set (comma-separated Lease names).
  SHARDS_ENV = "HANDOFF_SHARDS"
  # The longest lease duration the sidecar accepts, in seconds (1h).
  MAX_LEASE_DURATION = 3600.0
  # How far a leadership `sequence` may be ahead of the app's clock, in nanoseconds (1 s).
  MAX_SEQUENCE_AHEAD_NS = 1_000_000_000
  # The shortest token accepted, in characters.
  MIN_TOKEN_LENGTH = 32

  module Config
    module_function

    # Checks a token: at least 32 printable ASCII characters, none a space.
    # @param tok [String]
    # @raise [ConfigError] naming what is wrong
    # @return [void]
    def check_token(tok)
      if tok.bytesize < MIN_TOKEN_LENGTH
        raise ConfigError, "no usable token: #{tok.bytesize} bytes; want at least #{MIN_TOKEN_LENGTH} printable ASCII " \
                           "characters (handoff install writes 64 hex digits)"
      end
      tok.each_byte.with_index do |b, i|
        next if b.between?(0x21, 0x7e)

        raise ConfigError, "no usable token: byte #{i} is not printable ASCII; want printable ASCII characters and no space"
      end
    end

    # The token in the file at `path`: its content with surrounding white space removed.
    # @param path [String]
    # @return [String]
    # @raise [ConfigError] unreadable, or not a usable token
    def read_token_file(path)
      raw = begin
        File.binread(path)
      rescue SystemCallError => e
        raise ConfigError, "token file #{path}: #{e.message}"
      end
      tok = raw.strip
      begin
        check_token(tok)
      rescue ConfigError => e
        raise ConfigError, "token file #{path}: #{e.message}"
      end
      tok
    end

    UNITS = { "ns" => 1e-9, "us" => 1e-6, "\u00b5s" => 1e-6, "\u03bcs" => 1e-6, "ms" => 1e-3, "s" => 1.0, "m" => 60.0,
              "h" => 3600.0 }.freeze
    PART = /\A([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)/.freeze

    # Reads a Go duration (`15s`, `1m30s`, `500ms`, `1.5h`) as seconds.
    # @param str [String]
    # @return [Float] seconds
    # @raise [ArgumentError] if it is not one
    def parse_go_duration(str)
      rest = str.dup
      sign = 1.0
      if rest.start_with?("+", "-")
        sign = rest.start_with?("-") ? -1.0 : 1.0
        rest = rest[1..]
      end
      return 0.0 if rest == "0"
      raise ArgumentError, "time: invalid duration #{str.inspect}" if rest.empty?

      total = 0.0
      until rest.empty?
        m = PART.match(rest)
        raise ArgumentError, "time: invalid duration #{str.inspect}" if m.nil? || m[1] == "" || m[1] == "."

        total += Float("0#{m[1]}") * UNITS[m[2]]
        rest = rest[m[0].length..]
      end
      sign * total
    end

    # The longest grant the app accepts, in seconds: `override`, else
    # $HANDOFF_LEASE_DURATION, else 1 hour.
    # @param override [Numeric, nil] seconds, above 0
    # @return [Float]
    # @raise [ConfigError] for a bad override or environment value
    def lease_duration(override = nil)
      unless override.nil?
        unless override.is_a?(Numeric) && override.positive?
          raise ConfigError, "lease_duration #{override.inspect}: want a number of seconds above 0, or nil for #{LEASE_DURATION_ENV}"
        end

        return override.to_f
      end
      v = ENV.fetch(LEASE_DURATION_ENV, "")
      return MAX_LEASE_DURATION if v.empty?

      d = begin
        parse_go_duration(v)
      rescue ArgumentError
        -1.0
      end
      if d <= 0 || d > MAX_LEASE_DURATION
        raise ConfigError, "environment variable #{LEASE_DURATION_ENV} #{v.inspect}: want the sidecar's lease duration, " \
                           "a duration above 0 and at most 1h0m0s, like 15s"
      end
      d
    end

    # The token an Agent checks calls with: `token`, else the file
    # `token_file`, else the file $HANDOFF_TOKEN_FILE names.
    # @return [String, nil] nil only with `insecure_no_token` and no token configured
    # @raise [ConfigError]
    def agent_token(token, token_file, insecure_no_token)
      if token && !token.empty?
        begin
          check_token(token)
        rescue ConfigError => e
          raise ConfigError, "handoff: token: #{e.message}"
        end
        return token
      end
      path = token_file || ENV.fetch(TOKEN_FILE_ENV, "")
      unless path.empty?
        begin
          return read_token_file(path)
        rescue ConfigError => e
          raise ConfigError, "handoff: the pod's token (token_file: or #{TOKEN_FILE_ENV}): #{e.message}"
        end
      end
      return nil if insecure_no_token

      raise ConfigError, "handoff: no token configured: set the environment variable #{TOKEN_FILE_ENV} to the pod's token " \
                         "file (the handoff injector sets it to #{TOKEN_FILE}), or pass token_file: or token:; " \
                         "insecure_no_token: true serves without one, for local development only"
    end
  end

  # The pod's shard set: the Lease names in $HANDOFF_SHARDS; none when unset or empty.
  # @return [Array<String>]
  def self.shards_from_env
    ENV.fetch(SHARDS_ENV, "").split(",").map(&:strip).reject(&:empty?)
  end
end
