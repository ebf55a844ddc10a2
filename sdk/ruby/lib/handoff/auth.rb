# frozen_string_literal: true

require "openssl"
require "securerandom"

module Handoff
  # Signed calls (docs/protocol.md, "Signed calls").
  #
  # Every call carries three headers:
  #   Handoff-Timestamp: <Unix time in milliseconds>
  #   Handoff-Nonce: <16 to 64 of A-Z a-z 0-9 - _; new for every call>
  #   Authorization: HANDOFF-HMAC-SHA256 <64 lowercase hex digits>
  # The signature is the HMAC-SHA256, keyed with the pod's token, of six lines
  # joined by "\n": the scheme, the method, the request target as sent (path
  # and query), the timestamp, the nonce, and the lowercase hex SHA-256 of
  # the body.
  module Auth
    SCHEME = "HANDOFF-HMAC-SHA256"
    TIMESTAMP_HEADER = "Handoff-Timestamp"
    NONCE_HEADER = "Handoff-Nonce"
    # How far a call's timestamp may be from the receiver's clock, either way, in seconds.
    MAX_CLOCK_SKEW = 30.0
    # The most nonces a receiver remembers at once; past that it answers 503.
    MAX_NONCES = 1 << 16
    NONCE_RE = /\A[A-Za-z0-9_-]{16,64}\z/.freeze
    TIMESTAMP_RE = /\A[0-9]{1,15}\z/.freeze

    # A call {Verifier#verify} refused; answered {#status} (401, or 503 for {Busy}).
    class Refused < Handoff::Error
      # @return [Integer] the HTTP status to answer
      def status = 401
    end

    # A header of a signed call is missing or malformed.
    class Unsigned < Refused; end
    # The signature is not the token's over this call.
    class BadSignature < Refused; end
    # The timestamp is more than 30 s from the receiver's clock.
    class ClockSkew < Refused; end
    # A call with this nonce was accepted before.
    class Replayed < Refused; end
    # The call was signed before this receiver started (a call of the process before, replayed).
    class BeforeStart < Refused; end

    # 65,536 nonces are remembered: answered 503 with Retry-After: 1.
    class Busy < Refused
      def status = 503
    end

    module_function

    # @param body [String] bytes
    # @return [String] the lowercase hex SHA-256 of `body`
    def body_digest(body)
      OpenSSL::Digest::SHA256.hexdigest(body || "")
    end

    # The lowercase hex signature of one call.
    # @param token [String] the pod's token
    # @param method [String] e.g. "PUT"
    # @param target [String] path and query as sent
    # @param timestamp [String] Unix milliseconds, decimal
    # @param nonce [String]
    # @param digest [String] {body_digest} of the body
    # @return [String] 64 hex digits
    def signature(token, method, target, timestamp, nonce, digest)
      msg = [SCHEME, method, target, timestamp, nonce, digest].join("\n")
      OpenSSL::HMAC.hexdigest("SHA256", token.b, msg.b)
    end

    # The three headers that make a call signed with `token`; sign every send anew.
    # @param now [Float, nil] Unix seconds (default the wall clock)
    # @return [Hash{String=>String}]
    def sign(token, method, target, body = "", now: nil)
      ts = ((now || Time.now.to_f) * 1000).to_i.to_s
      nonce = SecureRandom.hex(16)
      { TIMESTAMP_HEADER => ts, NONCE_HEADER => nonce,
        "Authorization" => "#{SCHEME} #{signature(token, method, target, ts, nonce, body_digest(body))}" }
    end

    # Checks signed calls for one receiver and remembers their nonces. Thread-safe.
    class Verifier
      # @return [Integer] Unix milliseconds when this receiver started: calls signed earlier are refused
      attr_reader :started_millis

      # @param token [String] the pod's token
      # @param max_nonces [Integer]
      def initialize(token, max_nonces: MAX_NONCES, now: -> { Time.now.to_f })
        @token = token.b
        @max = max_nonces
        @now = now
        @started_millis = (@now.call * 1000).to_i
        @seen = {}
        @expiry = [] # [until, nonce], kept sorted by insertion time (until grows with the timestamp, roughly)
        @mu = Mutex.new
      end

      # Checks one call; raises a {Refused} if it is refused.
      # @param method [String]
      # @param target [String]
      # @param headers [Hash{String=>String}] lowercase names
      # @param body [String] bytes
      # @return [void]
      def verify(method, target, headers, body)
        authz = headers["authorization"].to_s
        ts = headers["handoff-timestamp"].to_s
        nonce = headers["handoff-nonce"].to_s
        scheme, _, sig = authz.partition(" ")
        if authz.empty?
          raise Unsigned, "not a signed call: no Authorization header; want \"#{SCHEME} <signature>\", #{TIMESTAMP_HEADER} " \
                          "and #{NONCE_HEADER} headers (docs/protocol.md, \"Signed calls\")"
        end
        unless scheme.ascii_only? && scheme.upcase == SCHEME
          raise Unsigned, "not a signed call: Authorization scheme #{scheme[0, 24].inspect}; want #{SCHEME} " \
                          "(a bearer token is not accepted: the token never crosses the wire)"
        end
        raise Unsigned, "not a signed call: the signature has #{sig.length} characters; want 64 lowercase hex digits" if sig.length != 64
        unless TIMESTAMP_RE.match?(ts)
          raise Unsigned, "not a signed call: #{TIMESTAMP_HEADER} #{ts[0, 24].inspect}; want the Unix time in milliseconds, " \
                          "a whole number of at most 15 digits"
        end
        unless NONCE_RE.match?(nonce)
          raise Unsigned, "not a signed call: #{NONCE_HEADER} #{nonce[0, 72].inspect}; want 16 to 64 characters of A-Z, a-z, 0-9, - and _"
        end

        want = Auth.signature(@token, method, target, ts, nonce, Auth.body_digest(body))
        unless OpenSSL.fixed_length_secure_compare(sig.downcase.b, want.b)
          raise BadSignature, "bad signature: the signature is not the pod's token's over this method, target, timestamp, nonce and body"
        end

        at = ts.to_i / 1000.0
        now = @now.call
        if (now - at).abs > MAX_CLOCK_SKEW
          raise ClockSkew, format("timestamp out of range: %s is %.3fs from this process's clock; want at most 30s either way",
                                  TIMESTAMP_HEADER, now - at)
        end
        if ts.to_i < @started_millis
          raise BeforeStart, format("signed before this receiver started: %s %s is %.3fs before this receiver started (%d); " \
                                    "a call made before a restart is not accepted after it: sign it anew and retry",
                                    TIMESTAMP_HEADER, ts, (@started_millis - ts.to_i) / 1000.0, @started_millis)
        end
        @mu.synchronize do
          raise Replayed, "replayed call: #{NONCE_HEADER} #{nonce} was accepted before; want a new nonce for every call" if @seen.key?(nonce)

          @expiry.shift while !@expiry.empty? && @expiry[0][0] < now && (@seen.delete(@expiry[0][1]) || true)
          raise Busy, "too many calls to remember: #{@max} calls in the last 60s" if @seen.size >= @max

          @seen[nonce] = at + MAX_CLOCK_SKEW
          @expiry << [at + MAX_CLOCK_SKEW, nonce]
          @expiry.sort_by!(&:first) if @expiry.size > 1 && @expiry[-2][0] > @expiry[-1][0]
        end
      end

      # @return [Integer] how many nonces are remembered now
      def remembered
        @mu.synchronize { @seen.size }
      end
    end
  end
end
