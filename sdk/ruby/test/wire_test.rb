# frozen_string_literal: true

require_relative "test_helper"

class WireTest < Minitest::Test
  W = Handoff::Wire

  def status_of
    yield
    nil
  rescue W::BodyError => e
    e.status
  end

  def test_parse_body
    assert_equal({ "a" => 1 }, W.parse_body(' {"a":1} '))
    assert_equal 400, status_of { W.parse_body("") }
    assert_equal 400, status_of { W.parse_body("[]") }
    assert_equal 400, status_of { W.parse_body("{} {}") }
    assert_equal 400, status_of { W.parse_body("{\"a\":NaN}") }
    assert_equal 400, status_of { W.parse_body("\xff".b) }
    assert_equal 413, status_of { W.parse_body("{}#{' ' * (64 << 10)}") }
  end

  def test_integers_are_whole_64_bit_numbers
    assert_equal 1_764_547_200_000_000_001, W.leadership(W.parse_body('{"sequence":1764547200000000001}')).sequence
    %w[1.0 1e3 9223372036854775808 "1" true].each do |v|
      assert_equal 400, status_of { W.leadership(W.parse_body(%({"sequence":#{v}}))) }, v
    end
    assert_equal 0, W.leadership(W.parse_body('{"sequence":null}')).sequence
  end

  def test_return_request
    assert_equal [true, 250], W.return_request(W.parse_body('{"cancel":true,"cancelWaitMillis":250}'))
    assert_equal 400, status_of { W.return_request(W.parse_body('{"cancelWaitMillis":-1}')) }
  end

  def test_rfc3339
    ns = W.parse_rfc3339("2025-01-02T15:04:15.123456789+01:00")
    assert_equal "2025-01-02T14:04:15.123456789Z", W.format_rfc3339(ns)
    assert_raises(ArgumentError) { W.parse_rfc3339("2025-02-30T00:00:00Z") }
    assert_raises(ArgumentError) { W.parse_rfc3339("2025-01-02 15:04:15Z") }
  end

  def test_wait_millis
    assert_equal 0.0, Handoff::HTTP.wait_param("")
    assert_equal 0.25, Handoff::HTTP.wait_param("waitMillis=250")
    assert_equal 30.0, Handoff::HTTP.wait_param("waitMillis=99999999999999999999")
    %w[waitMillis=-1 waitMillis=1.5 waitMillis=1e3 waitMillis=soon waitMillis=1&waitMillis=2].each do |q|
      assert_raises(ArgumentError, q) { Handoff::HTTP.wait_param(q) }
    end
  end

  def test_drain_status_json
    st = W::DrainStatus.new(stopping: true, in_flight: 2, unstarted: 0, receiving: 0, running_millis: 0, drained: false, instance: "ab")
    assert_equal %({"stopping":true,"inFlight":2,"receiving":0,"drained":false,"instance":"ab"}\n), W.encode(st)
  end

  def test_endpoints
    assert_equal :unix, Handoff::Endpoint.parse("unix:///handoff-run/app.sock").network
    assert_equal 7452, Handoff::Endpoint.parse("http://127.0.0.1:7452").port
    ["unix://rel.sock", "unix:///a/../b.sock", "http://localhost:1", "10.0.0.1:1", "http://127.0.0.1:1/path", "127.0.0.1:99999"].each do |a|
      assert_raises(Handoff::EndpointError, a) { Handoff::Endpoint.parse(a) }
    end
  end
end
