# frozen_string_literal: true

require "socket"
require "io/wait"

module Handoff
  # The app API over HTTP/1.1 (docs/protocol.md, "What the app serves"): a
  # small server on the standard library's sockets, for a Unix socket or
  # loopback TCP. Content-Length and chunked bodies, `Expect: 100-continue`,
  # keep-alive; each answer written in one piece.
  module HTTP
    STOP_CLAIMING_PATH = "/handoff/v1/stop-claiming"
    DRAIN_PATH = "/handoff/v1/drain"
    RETURN_PATH = "/handoff/v1/return"
    LEASE_PATH_PREFIX = "/handoff/v1/leases/"
    METHODS = { STOP_CLAIMING_PATH => "POST", DRAIN_PATH => "GET", RETURN_PATH => "POST", LEASE_PATH_PREFIX => "PUT" }.freeze
    # The largest request head read, in bytes.
    MAX_HEADER_BYTES = 8 << 10
    # The longest one drain long poll waits, in seconds.
    MAX_DRAIN_WAIT = 30.0
    # Connections served at once.
    MAX_CONNS = 64
    # Seconds a client has to send its request head and body.
    READ_TIMEOUT = 5.0
    # Seconds an idle kept-alive connection is kept.
    IDLE_TIMEOUT = 90.0
    REASONS = { 200 => "OK", 400 => "Bad Request", 401 => "Unauthorized", 404 => "Not Found", 405 => "Method Not Allowed",
                411 => "Length Required", 413 => "Request Entity Too Large", 422 => "Unprocessable Entity",
                431 => "Request Header Fields Too Large", 501 => "Not Implemented", 503 => "Service Unavailable",
                505 => "HTTP Version Not Supported" }.freeze
    TOKEN = /\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\z/.freeze

    # A request that cannot be read: answered `status` and the connection closed.
    class ProtocolError < Handoff::Error
      attr_reader :status

      def initialize(status, msg)
        super(msg)
        @status = status
      end
    end

    # The connection ended, or the client was too slow.
    class Gone < StandardError; end

    Head = Struct.new(:method, :target, :version, :headers, :keep_alive)

    # One answer, rendered as the bytes of one write.
    Response = Struct.new(:status, :body, :headers, :close) do
      def render
        lines = ["HTTP/1.1 #{status} #{REASONS.fetch(status, 'Status')}", "Content-Type: application/json",
                 "Content-Length: #{body.bytesize}"]
        (headers || []).each { |k, v| lines << "#{k}: #{v}" }
        lines << "Connection: close" if close
        "#{lines.join("\r\n")}\r\n\r\n".b + body.b
      end
    end

    module_function

    def json(status, obj, headers = [], close: false) = Response.new(status, Wire.encode(obj), headers, close)

    def error(status, msg, headers = [], close: false) = json(status, { "error" => msg }, headers, close: close)

    # Reads a request head (up to its blank line).
    # @return [Head]
    # @raise [ProtocolError]
    def parse_head(data)
      lines = data.b.split("\n", -1).map { |l| l.delete_suffix("\r") }
      lines.pop while !lines.empty? && lines[-1].empty?
      raise ProtocolError.new(400, "malformed HTTP request: empty") if lines.empty?

      parts = lines[0].split(" ", -1)
      raise ProtocolError.new(400, "malformed HTTP request line") if parts.size != 3 || !TOKEN.match?(parts[0]) || parts[1].empty?

      version = parts[2]
      raise ProtocolError.new(505, "unsupported protocol version #{version[0, 16].inspect}; want HTTP/1.1") unless %w[HTTP/1.1 HTTP/1.0].include?(version)

      headers = {}
      lines[1..].each do |ln|
        name, sep, value = ln.partition(":")
        raise ProtocolError.new(400, "malformed MIME header line") if sep.empty? || !TOKEN.match?(name)

        key = name.downcase
        v = value.gsub(/\A[ \t]+|[ \t]+\z/, "")
        raise ProtocolError.new(400, "repeated Content-Length headers with different values") if key == "content-length" && headers.key?(key) && headers[key] != v

        headers[key] ||= v
      end
      conn = headers.fetch("connection", "").downcase
      keep = version == "HTTP/1.1" ? !conn.include?("close") : conn.include?("keep-alive")
      Head.new(parts[0], parts[1], version, headers, keep)
    end

    # The drain long poll's `waitMillis` in seconds: absent or empty 0, above 30000 30 s.
    # @raise [ArgumentError] naming the value and the accepted form
    def wait_param(query)
      values = []
      (query || "").split("&").each do |pair|
        next if pair.empty? || pair.include?(";")

        k, _, v = pair.partition("=")
        begin
          k = URI.decode_www_form_component(k)
          v = URI.decode_www_form_component(v)
        rescue ArgumentError
          next
        end
        values << v if k == "waitMillis"
      end
      raise ArgumentError, "waitMillis given #{values.size} times; want it once" if values.size > 1
      return 0.0 if values.empty? || values[0].strip.empty?

      v = values[0].strip
      unless v.match?(/\A\+?[0-9]+\z/)
        raise ArgumentError, "waitMillis #{JSON.generate(values[0])}: want a whole number of milliseconds, 0 or more"
      end

      [v.to_i / 1000.0, MAX_DRAIN_WAIT].min
    end

    def unquote(seg)
      seg.b.gsub(/%(\h\h)/) { Regexp.last_match(1).hex.chr }.force_encoding(Encoding::UTF_8)
    end

    # The route, query and Lease of a request target; route nil for a path the protocol does not define.
    def route(target)
      path, _, query = target.partition("?")
      path = path.sub(%r{\Ahttps?://[^/]*}, "").then { |p| p.empty? ? "/" : p } if path.match?(%r{\Ahttps?://})
      return [path, query, nil] if [STOP_CLAIMING_PATH, DRAIN_PATH, RETURN_PATH].include?(path)

      if path.start_with?(LEASE_PATH_PREFIX)
        seg = path.delete_prefix(LEASE_PATH_PREFIX)
        return [LEASE_PATH_PREFIX, query, unquote(seg)] if !seg.empty? && !seg.include?("/")
      end
      [nil, query, nil]
    end

    # Checks one call and answers it: a {Response}, or nil when the client went away while it waited.
    # @param agent [Agent]
    # @param gone [#call] whether the client has gone (a waited call then ends without answer)
    def dispatch(agent, head, body, gone)
      if agent.verifier
        begin
          agent.verifier.verify(head.method, head.target, head.headers, body)
        rescue Auth::Refused => e
          msg = "#{e.message} (the pod's token is the file named by HANDOFF_TOKEN_FILE)"
          return error(503, msg, [["Retry-After", "1"]]) if e.status == 503

          return error(401, msg, [["WWW-Authenticate", "#{Auth::SCHEME} realm=\"handoff\""]])
        end
      end
      path, query, lease = route(head.target)
      return error(404, "404 page not found: #{head.target.partition('?')[0][0, 200]} is not a path of the handoff app API") if path.nil?

      want = METHODS[path]
      return error(405, "method #{head.method[0, 16]} not allowed; use #{want}", [["Allow", want]]) if head.method != want

      case path
      when STOP_CLAIMING_PATH
        json(200, agent.stop_claiming)
      when DRAIN_PATH
        seconds = begin
          wait_param(query)
        rescue ArgumentError => e
          return error(400, e.message)
        end
        drain(agent, seconds, gone)
      when RETURN_PATH
        cancel, wait_ms = begin
          Wire.return_request(Wire.parse_body(body))
        rescue Wire::BodyError => e
          return error(e.status, e.message)
        end
        json(200, agent.return_fallback(cancel: cancel, cancel_wait: wait_ms / 1000.0))
      else
        leadership(agent, lease, body, gone)
      end
    end

    def drain(agent, seconds, gone)
      deadline = Handoff.monotonic + seconds
      loop do
        drained, changed = agent.drained_and_changed
        left = deadline - Handoff.monotonic
        break if drained || left <= 0
        return nil if !changed.wait([left, 0.25].min) && gone.call
      end
      json(200, agent.drain_status)
    end

    def leadership(agent, lease, body, gone)
      clock = agent.clock
      received_mono = clock.monotonic
      received_wall_ns = (clock.time * 1e9).to_i
      msg = begin
        Wire.leadership(Wire.parse_body(body))
      rescue Wire::BodyError => e
        return error(e.status, e.message)
      end
      if !msg.lease.empty? && msg.lease != lease
        return error(400, "body: lease #{JSON.generate(msg.lease)} differs from the path's Lease #{JSON.generate(lease)}; " \
                          "want the same name, or leave it out")
      end
      why = agent.genuine(msg, received_wall_ns)
      return error(422, why) if why

      grant = nil
      if msg.leader
        until_mono = received_mono + [msg.valid_for_millis, 0].max / 1000.0
        until_mono = [until_mono, received_mono + (msg.until_ns - received_wall_ns) / 1e9].min if msg.until_ns
        grant = [msg.fencing_token, until_mono]
      end
      stale, terms = agent.apply_leadership(lease, msg.sequence, grant)
      return json(200, { "leader" => msg.leader, "stale" => true }) if stale
      return json(200, { "leader" => true }) if msg.leader

      loop do
        _, changed = agent.leader_work_left(terms)
        break if changed.nil?
        return nil if !changed.wait(0.25) && gone.call
      end
      agent.logger.info("leadership revoked: #{lease}")
      json(200, { "leader" => false })
    end

    # Reads requests off one connection with deadlines.
    class Reader
      def initialize(sock)
        @sock = sock
        @buf = +"".b
        @deadline = 0
      end

      def fill(deadline)
        left = deadline - Handoff.monotonic
        raise Gone if left <= 0
        raise Gone unless @sock.wait_readable(left)

        data = @sock.read_nonblock(65_536, exception: false)
        raise Gone if data.nil?
        return if data == :wait_readable

        @buf << data
      rescue SystemCallError, IOError
        raise Gone
      end

      # The next request head; nil when the client is done.
      def head
        begin
          while @buf.sub(/\A[\r\n]+/, "").empty?
            @buf.clear
            fill(Handoff.monotonic + IDLE_TIMEOUT)
          end
        rescue Gone
          return nil
        end
        @buf.sub!(/\A[\r\n]+/, "")
        @deadline = Handoff.monotonic + READ_TIMEOUT
        loop do
          i = @buf.index("\r\n\r\n")
          n = 4
          j = @buf.index("\n\n")
          if j && (i.nil? || j < i)
            i = j
            n = 2
          end
          return @buf.slice!(0, i + n) if i
          raise ProtocolError.new(431, "request header too large: want at most #{MAX_HEADER_BYTES} bytes") if @buf.bytesize > MAX_HEADER_BYTES

          fill(@deadline)
        end
      end

      def exact(n)
        fill(@deadline) while @buf.bytesize < n
        @buf.slice!(0, n)
      end

      def line
        loop do
          i = @buf.index("\n")
          return @buf.slice!(0, i + 1).sub(/\r?\n\z/, "") if i
          raise ProtocolError.new(400, "malformed chunked encoding") if @buf.bytesize > 4096

          fill(@deadline)
        end
      end

      # The body; nil when over the limit.
      def body(kind, n)
        if kind == :length
          return nil if n > Wire::MAX_BODY_BYTES

          return exact(n)
        end
        out = +"".b
        loop do
          size = line.split(";", 2)[0].to_s.strip
          raise ProtocolError.new(400, "malformed chunked encoding") unless size.match?(/\A\h{1,16}\z/)

          size = size.hex
          if size.zero?
            nil until line.empty? # trailers
            return out
          end
          return nil if out.bytesize + size > Wire::MAX_BODY_BYTES

          out << exact(size)
          raise ProtocolError.new(400, "malformed chunked encoding") unless line.empty?
        end
      end
    end

    # The server: one thread accepting, one per connection (at most {MAX_CONNS}).
    class Server
      # @return [String] the address served
      attr_reader :url

      def initialize(agent, endpoint)
        @agent = agent
        @e = endpoint
        @sock = endpoint.listen
        @ino = endpoint.network == :unix ? File.stat(endpoint.address).ino : 0
        @url = if endpoint.network == :tcp
                 addr = @sock.local_address
                 host = addr.ip_address
                 "http://#{host.include?(':') ? "[#{host}]" : host}:#{addr.ip_port}"
               else
                 endpoint.to_s
               end
        @conns = {}
        @lock = Mutex.new
        @slots = Queue.new
        MAX_CONNS.times { @slots << true }
        @closed = false
      end

      def start
        @thread = Thread.new { accept_loop }
      end

      def close
        return if @closed

        @closed = true
        begin
          @sock.close
        rescue IOError
          nil
        end
        if @e.network == :unix
          begin
            File.unlink(@e.address) if File.stat(@e.address).ino == @ino
          rescue SystemCallError
            nil
          end
        end
        @lock.synchronize { @conns.keys }.each do |c|
          c.close
        rescue IOError
          nil
        end
        @thread&.join(2)
      end

      private

      def accept_loop
        until @closed
          @slots.pop
          conn = begin
            @sock.accept
          rescue IOError, SystemCallError
            @slots << true
            return if @closed

            sleep 0.01
            next
          end
          @lock.synchronize { @conns[conn] = true }
          Thread.new(conn) { |c| serve(c) }
        end
      end

      def gone?(conn)
        return false unless conn.wait_readable(0)

        conn.recv_nonblock(1, Socket::MSG_PEEK, exception: false).then { |d| d.nil? || d == "" }
      rescue SystemCallError, IOError
        true
      end

      def serve(conn)
        conn.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) if @e.network == :tcp
        rd = Reader.new(conn)
        until @closed
          head = nil
          body = nil
          begin
            raw = rd.head
            return if raw.nil?

            head = HTTP.parse_head(raw)
            kind, n = framing(head)
            if head.headers.fetch("expect", "").casecmp?("100-continue") && head.version == "HTTP/1.1" &&
               (kind == :chunked || (n.positive? && n <= Wire::MAX_BODY_BYTES))
              conn.write("HTTP/1.1 100 Continue\r\n\r\n")
            end
            body = rd.body(kind, n)
          rescue ProtocolError => e
            conn.write(HTTP.error(e.status, e.message, close: true).render)
            linger(conn)
            return
          rescue Gone
            return
          end
          if body.nil?
            conn.write(HTTP.error(413, "body: larger than #{Wire::MAX_BODY_BYTES} bytes; want at most #{Wire::MAX_BODY_BYTES} " \
                                       "bytes (64 KiB) of JSON", close: true).render)
            linger(conn)
            return
          end
          resp = HTTP.dispatch(@agent, head, body, -> { gone?(conn) })
          return if resp.nil?

          resp.close = true unless head.keep_alive
          conn.write(resp.render) # one write: status line, headers and body together
          return if resp.close
        end
      rescue IOError, SystemCallError
        nil
      rescue StandardError => e
        @agent.logger.error("handoff: serving a call: #{e.class}: #{e.message}")
      ensure
        @lock.synchronize { @conns.delete(conn) }
        begin
          conn.close
        rescue IOError
          nil
        end
        @slots << true
      end

      def framing(head)
        te = head.headers["transfer-encoding"]
        if te
          raise ProtocolError.new(501, "unsupported transfer encoding #{te[0, 32].inspect}") unless te.casecmp?("chunked")

          return [:chunked, 0]
        end
        cl = head.headers["content-length"]
        return [:length, 0] if cl.nil?
        raise ProtocolError.new(400, "bad Content-Length #{cl[0, 32].inspect}") unless cl.match?(/\A[0-9]+\z/)

        [:length, cl.to_i]
      end

      # Closes after an answer sent before the request was read whole: shuts
      # down writing, then drops what the client still sends (0.5 s, 256 KiB).
      def linger(conn)
        conn.close_write
        deadline = Handoff.monotonic + 0.5
        n = 0
        while n < (256 << 10)
          left = deadline - Handoff.monotonic
          return if left <= 0 || !conn.wait_readable(left)

          data = conn.read_nonblock(65_536, exception: false)
          return if data.nil?

          n += data.bytesize if data.is_a?(String)
        end
      rescue IOError, SystemCallError
        nil
      end
    end
  end
end
