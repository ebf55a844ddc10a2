# frozen_string_literal: true

require "json"

module Handoff
  # The messages of the app API (docs/protocol.yaml, components.schemas) and
  # how their bodies are read: one JSON object of at most 64 KiB, unknown
  # fields ignored, an absent field or null read as its zero value, a number
  # read into an integer field only if it is a whole number in decimal within
  # 64 bits (not 1.0 or 1e3), a time only in RFC 3339.
  module Wire
    # The largest request body read, in bytes (64 KiB); larger: 413.
    MAX_BODY_BYTES = 64 << 10
    INT64 = (-(1 << 63))..((1 << 63) - 1)

    # A body the app refuses: {#status} (400 or 413) and the message for `{"error": ...}`.
    class BodyError < Handoff::Error
      # @return [Integer]
      attr_reader :status

      def initialize(status, msg)
        super(msg)
        @status = status
      end
    end

    # The drain status (stop-claiming and drain answer it). Counts are
    # claims; `running_millis` is milliseconds; `instance` names the process.
    DrainStatus = Struct.new(:stopping, :in_flight, :unstarted, :receiving, :running_millis, :drained, :instance,
                             keyword_init: true) do
      # @return [Hash] the JSON object, optional zero fields left out (`receiving` always sent)
      def to_json_object
        h = { "stopping" => stopping, "inFlight" => in_flight }
        h["unstarted"] = unstarted if unstarted.positive?
        h["receiving"] = receiving
        h["runningMillis"] = running_millis if running_millis.positive?
        h["drained"] = drained
        h["instance"] = instance unless instance.to_s.empty?
        h
      end
    end

    # What a `return` call handed back: `returned` claims, and `error` (empty on success).
    ReturnResult = Struct.new(:returned, :error) do
      def to_json_object
        h = { "returned" => returned }
        h["error"] = error unless error.to_s.empty?
        h
      end
    end

    # A grant or revoke as the sidecar sends it. `sequence` and `until_ns`
    # are Unix nanoseconds (`until_ns` nil when absent); `valid_for_millis`
    # counts from receipt.
    Leadership = Struct.new(:lease, :leader, :sequence, :holder_identity, :fencing_token, :until_ns, :valid_for_millis,
                            keyword_init: true)

    module_function

    # Reads a request body: one JSON object, nothing after it but white space.
    # @param body [String] bytes
    # @return [Hash{String=>Object}]
    # @raise [BodyError] 413 over 64 KiB; 400 empty, not UTF-8, not JSON, not an object, or followed by more
    def parse_body(body)
      if body.bytesize > MAX_BODY_BYTES
        raise BodyError.new(413, "body: larger than #{MAX_BODY_BYTES} bytes; want at most #{MAX_BODY_BYTES} bytes (64 KiB) of JSON")
      end

      text = body.dup.force_encoding(Encoding::UTF_8)
      raise BodyError.new(400, "body: not UTF-8; want one JSON object") unless text.valid_encoding?
      raise BodyError.new(400, "body: empty; want one JSON object") if text.strip.empty?

      value = begin
        JSON.parse(text, allow_nan: false, create_additions: false, max_nesting: 10_000)
      rescue JSON::ParserError, JSON::NestingError => e
        msg = e.message.lines.first.to_s.strip[0, 120]
        raise BodyError.new(400, "body: #{msg}; want one JSON object and nothing after it but white space")
      end
      raise BodyError.new(400, "body: #{JSON.generate(value)[0, 20]} is not a JSON object; want one JSON object") unless value.is_a?(Hash)

      value
    end

    # One field of a decoded object, checked against its type.
    # @param kind [Symbol] :bool, :int, :str or :time
    # @return [Object] the value, or the zero value (false, 0, "", nil) when absent or null
    # @raise [BodyError] 400 naming the field and its type
    def field(obj, name, kind, go_type)
      v = obj[name]
      return { bool: false, int: 0, str: "", time: nil }[kind] if v.nil?

      ok = case kind
           when :bool then v == true || v == false
           when :int then v.is_a?(Integer) && INT64.cover?(v)
           else v.is_a?(String)
           end
      raise BodyError.new(400, "body: json: cannot unmarshal #{json_kind(v)} into field #{name} of type #{go_type}; want one JSON object") unless ok
      return v unless kind == :time

      begin
        parse_rfc3339(v)
      rescue ArgumentError => e
        raise BodyError.new(400, "body: #{e.message}; want one JSON object")
      end
    end

    def json_kind(v)
      case v
      when true, false then "bool"
      when Numeric then "number #{v}"
      when String then "string"
      when Array then "array"
      else "object"
      end
    end

    RFC3339 = /\A(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:(Z)|([+-])(\d{2}):(\d{2}))\z/.freeze

    # Reads an RFC 3339 time (up to nanoseconds, Z or an offset).
    # @param str [String]
    # @return [Integer] Unix nanoseconds
    # @raise [ArgumentError]
    def parse_rfc3339(str)
      m = RFC3339.match(str)
      raise ArgumentError, "parsing time #{str[0, 40].inspect} as RFC 3339: want a time like 2025-01-02T15:04:05.123456789Z" unless m

      year, month, day, hour, min, sec = (1..6).map { |i| m[i].to_i }
      leap = (year % 4).zero? && (!(year % 100).zero? || (year % 400).zero?)
      mdays = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
      unless month.between?(1, 12) && day.between?(1, mdays[month - 1]) && hour < 24 && min < 60 && sec < 60
        raise ArgumentError, "parsing time #{str[0, 40].inspect} as RFC 3339: a field is out of range"
      end

      ns = (m[7] || "")[0, 9].ljust(9, "0").to_i
      offset = 0
      if m[8].nil?
        oh = m[10].to_i
        om = m[11].to_i
        raise ArgumentError, "parsing time #{str[0, 40].inspect} as RFC 3339: the zone offset is out of range" if oh >= 24 || om >= 60

        offset = (oh * 3600 + om * 60) * (m[9] == "+" ? 1 : -1)
      end
      secs = Time.utc(year, month, day, hour, min, sec).to_i - offset
      secs * 1_000_000_000 + ns
    end

    # Writes Unix nanoseconds as Go writes a UTC time (trailing zeros of the fraction dropped).
    # @param unix_ns [Integer]
    # @return [String]
    def format_rfc3339(unix_ns)
      secs, ns = unix_ns.divmod(1_000_000_000)
      frac = format("%09d", ns).sub(/0+\z/, "")
      Time.at(secs).utc.strftime("%Y-%m-%dT%H:%M:%S") + (frac.empty? ? "" : ".#{frac}") + "Z"
    end

    # Reads a return request.
    # @return [Array(Boolean, Integer)] cancel, cancelWaitMillis
    # @raise [BodyError]
    def return_request(obj)
      cancel = field(obj, "cancel", :bool, "bool")
      wait = field(obj, "cancelWaitMillis", :int, "int64")
      raise BodyError.new(400, "body: cancelWaitMillis #{wait}; want a whole number of milliseconds, 0 or more") if wait.negative?

      [cancel, wait]
    end

    # Reads a leadership message.
    # @return [Leadership]
    # @raise [BodyError]
    def leadership(obj)
      Leadership.new(
        lease: field(obj, "lease", :str, "string"),
        leader: field(obj, "leader", :bool, "bool"),
        sequence: field(obj, "sequence", :int, "int64"),
        holder_identity: field(obj, "holderIdentity", :str, "string"),
        fencing_token: field(obj, "fencingToken", :int, "int64"),
        until_ns: field(obj, "until", :time, "time.Time"),
        valid_for_millis: field(obj, "validForMillis", :int, "int64")
      )
    end

    # One answer body: compact JSON and a newline.
    # @param obj [Hash, #to_json_object]
    # @return [String]
    def encode(obj)
      obj = obj.to_json_object if obj.respond_to?(:to_json_object)
      "#{JSON.generate(obj)}\n"
    end
  end
end
