# frozen_string_literal: true

require_relative "test_helper"

class AuthTest < Minitest::Test
  Auth = Handoff::Auth

  def test_signature_vector
    # docs/protocol.md, "Signed calls": Go's and Python's TestSignatureVector.
    sig = Auth.signature(TestHelper::TOKEN, "PUT", "/handoff/v1/leases/orders", "1767225600000",
                         "0123456789abcdef0123456789abcdef", Auth.body_digest('{"lease":"orders","leader":false,"sequence":1}'))
    assert_equal "a0f1c8d2ed8f4e07198cb8d99f3dab235a5951df319652a0efa706b242fa2a7e", sig
  end

  def headers(h) = h.transform_keys(&:downcase)

  def test_verify_accepts_once_and_refuses_a_replay
    v = Auth::Verifier.new(TestHelper::TOKEN)
    h = headers(Auth.sign(TestHelper::TOKEN, "POST", "/handoff/v1/stop-claiming", ""))
    v.verify("POST", "/handoff/v1/stop-claiming", h, "")
    assert_raises(Auth::Replayed) { v.verify("POST", "/handoff/v1/stop-claiming", h, "") }
    assert_equal 1, v.remembered
  end

  def test_refusals
    v = Auth::Verifier.new(TestHelper::TOKEN)
    good = headers(Auth.sign(TestHelper::TOKEN, "GET", "/handoff/v1/drain", ""))
    assert_raises(Auth::Unsigned) { v.verify("GET", "/handoff/v1/drain", {}, "") }
    assert_raises(Auth::Unsigned) { v.verify("GET", "/handoff/v1/drain", { "authorization" => "Bearer #{TestHelper::TOKEN}" }, "") }
    assert_raises(Auth::BadSignature) { v.verify("GET", "/handoff/v1/drain?waitMillis=1", good, "") }
    assert_raises(Auth::BadSignature) { v.verify("GET", "/handoff/v1/drain", good, "x") }
    other = headers(Auth.sign("x" * 32, "GET", "/handoff/v1/drain", ""))
    assert_raises(Auth::BadSignature) { v.verify("GET", "/handoff/v1/drain", other, "") }
    old = headers(Auth.sign(TestHelper::TOKEN, "GET", "/handoff/v1/drain", "", now: Time.now.to_f - 31))
    assert_raises(Auth::ClockSkew) { v.verify("GET", "/handoff/v1/drain", old, "") }
    before = headers(Auth.sign(TestHelper::TOKEN, "GET", "/handoff/v1/drain", "", now: Time.now.to_f - 1))
    e = assert_raises(Auth::BeforeStart) { v.verify("GET", "/handoff/v1/drain", before, "") }
    assert_match(/\Asigned before this receiver started/, e.message)
    v.verify("GET", "/handoff/v1/drain", good, "")
  end

  def test_busy_past_the_nonce_bound
    v = Auth::Verifier.new(TestHelper::TOKEN, max_nonces: 2)
    2.times { v.verify("GET", "/x", headers(Auth.sign(TestHelper::TOKEN, "GET", "/x", "")), "") }
    e = assert_raises(Auth::Busy) { v.verify("GET", "/x", headers(Auth.sign(TestHelper::TOKEN, "GET", "/x", "")), "") }
    assert_equal 503, e.status
  end

  def test_config
    assert_raises(Handoff::ConfigError) { Handoff::Config.check_token("short") }
    assert_raises(Handoff::ConfigError) { Handoff::Config.check_token("#{'a' * 32} b") }
    assert_in_delta 90.0, Handoff::Config.parse_go_duration("1m30s")
    assert_in_delta 0.5, Handoff::Config.parse_go_duration("500ms")
    assert_raises(ArgumentError) { Handoff::Config.parse_go_duration("15") }
    e = assert_raises(Handoff::ConfigError) { Handoff::Agent.new(token: nil, token_file: "/nonexistent/token") }
    assert_match(/token_file: or HANDOFF_TOKEN_FILE/, e.message)
  end
end
