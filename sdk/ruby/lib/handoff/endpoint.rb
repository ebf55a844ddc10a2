# frozen_string_literal: true

require "socket"
require "ipaddr"

module Handoff
  # An address of the protocol (docs/protocol.md, "Transport"): `unix://` and
  # an absolute socket path of at most 107 bytes, or a loopback TCP address
  # given as an IP (`http://127.0.0.1:7452`, `127.0.0.1:7452`; not `localhost`).
  class Endpoint
    # The environment variable with the app API's address, set by the injector.
    APP_URL_ENV = "HANDOFF_APP_URL"
    # The app socket in an injected pod.
    APP_SOCKET = "/handoff-run/app.sock"
    # The mode of a socket the server makes: the volume, not the mode, keeps others out.
    SOCKET_MODE = 0o666
    MAX_SOCKET_PATH = 107
    FORMS = "unix:// and an absolute socket path, like unix:///handoff-run/app.sock, or a loopback address, " \
            "like http://127.0.0.1:7452 or 127.0.0.1:7450"

    # @return [Symbol] :unix or :tcp
    attr_reader :network
    # @return [String] the socket path, or host:port
    attr_reader :address
    # @return [String] the TCP host ("" for unix)
    attr_reader :host
    # @return [Integer] the TCP port (0 for unix)
    attr_reader :port

    def initialize(network, address, host = "", port = 0)
      @network = network
      @address = address
      @host = host
      @port = port
    end

    def to_s = network == :unix ? "unix://#{address}" : "http://#{address}"

    # Reads an address in the protocol's one form.
    # @param str [String]
    # @return [Endpoint]
    # @raise [EndpointError] saying what is wrong and the accepted forms
    def self.parse(str)
      bad = ->(why) { EndpointError.new("#{str.inspect}: #{why}; want #{FORMS}") }
      if str.start_with?("unix://")
        p = str.delete_prefix("unix://")
        raise bad.call("the socket path is not absolute") unless p.start_with?("/")

        clean = File.expand_path(p)
        raise bad.call("the socket path is not clean (#{clean})") if clean != p
        raise bad.call("the socket path has #{p.bytesize} bytes, more than the #{MAX_SOCKET_PATH} a Unix socket address holds") if p.bytesize > MAX_SOCKET_PATH

        return new(:unix, p)
      end
      hostport = str
      if str.start_with?("http://")
        hostport = str.delete_prefix("http://")
        raise bad.call("an http address has a host and port only (no user, path, query or fragment)") if hostport.match?(%r{[@?#]|/.})

        hostport = hostport.delete_suffix("/")
      end
      if hostport.start_with?("[")
        close = hostport.index("]")
        raise bad.call("not a host:port") if close.nil? || hostport[close + 1] != ":"

        host = hostport[1...close]
        port = hostport[(close + 2)..]
      else
        host, sep, port = hostport.rpartition(":")
        raise bad.call("not a host:port") if sep.empty? || host.include?(":")
      end
      raise bad.call("port #{port.inspect} is not a number from 0 to 65535") unless port.match?(/\A[0-9]{1,5}\z/) && port.to_i <= 65_535
      if host == "localhost"
        raise bad.call("localhost names both 127.0.0.1 and ::1, and a neighbour could serve the one the server does not bind: " \
                       "give the loopback address itself, like 127.0.0.1")
      end
      loopback = begin
        IPAddr.new(host).loopback?
      rescue IPAddr::Error
        false
      end
      raise bad.call("#{host.inspect} is not a loopback address: the protocol is never spoken beyond the pod's loopback") unless loopback

      new(:tcp, hostport, host, port.to_i)
    end

    # The app's address: `url`, else $HANDOFF_APP_URL.
    # @return [Endpoint]
    # @raise [EndpointError]
    def self.app(url = nil)
      return parse(url) if url && !url.empty?

      env = ENV.fetch(APP_URL_ENV, "")
      raise EndpointError, "handoff app address: none given and #{APP_URL_ENV} is not set (the handoff injector sets it to unix://#{APP_SOCKET})" if env.empty?

      begin
        parse(env)
      rescue EndpointError => e
        raise EndpointError, "handoff app environment variable #{APP_URL_ENV}: #{e.message}"
      end
    end

    # A listening socket. A Unix socket is made at the path itself with mode
    # 0666; a path that exists and is not a socket is refused, never
    # replaced; so is a socket another process serves; a stale one is removed.
    # @return [Socket, UNIXServer, TCPServer]
    # @raise [EndpointError]
    def listen
      return TCPServer.new(host, port) if network == :tcp

      st = begin
        File.lstat(address)
      rescue Errno::ENOENT
        nil
      end
      if st
        raise EndpointError, "socket #{address}: the path exists and is not a socket; refusing to replace it" unless st.socket?

        begin
          UNIXSocket.new(address).close
          raise EndpointError, "socket #{address}: another process serves it"
        rescue Errno::ECONNREFUSED
          File.unlink(address)
        rescue SystemCallError => e
          raise EndpointError, "socket #{address}: checking whether it is stale: #{e.message}"
        end
      end
      srv = UNIXServer.new(address)
      File.chmod(SOCKET_MODE, address)
      srv
    end

    # A connection to this address; a socket's path must be a socket itself, never a link.
    # @return [Socket]
    # @raise [Errno::ECONNREFUSED] no socket there yet
    # @raise [EndpointError] something else at the path
    def dial
      return TCPSocket.new(host, port) if network == :tcp

      st = begin
        File.lstat(address)
      rescue Errno::ENOENT
        raise Errno::ECONNREFUSED, "dial unix #{address}: no socket there"
      end
      raise EndpointError, "socket #{address}: not a socket; refusing to connect" unless st.socket?

      UNIXSocket.new(address)
    end
  end
end
