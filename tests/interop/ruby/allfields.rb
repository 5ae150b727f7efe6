# Every field type bunny writes, and a typed view of every header it reads (issue 21).
#
#   ruby allfields.rb publish-all <amqp-url> <omit> <queue>...
#       publish "ruby-all" to each queue, its headers using every field type bunny writes, with
#       boundary values, and "ruby-binary" (a String that is not UTF-8, which bunny writes as a
#       long string S); omit is accepted for symmetry (bunny writes only tags every client reads)
#   ruby allfields.rb consume-typed <amqp-url> <queue>...
#       reject every delivery (requeue=false), printing per delivery a JSON line
#       {"queue", "message_id", "redelivered", "headers"} where headers maps each name to a cell
#       {"type": "<tag>/<Ruby class>", "value": <canonical value>}, recursing into tables and arrays
#
# bunny (amq-protocol 2.3.2) writes S (String, Symbol, also a binary String), l (every Integer),
# d (Float), f (AMQ::Protocol::Float32Bit, but in the host's byte order: amq-protocol packs it
# with "f", so on x86 1.5 arrives as 1.7e-41, and the float32 maximum as a NaN, which makes
# RabbitMQ 3.10 close the connection with INTERNAL_ERROR: not published), D (BigDecimal), t, T (Time, signed: a time before
# 1970 is written as the uint64 wrap-around), V, A (Array), F (Hash). It cannot write b B s u I i
# x. Its size computation of an Array (TableValueEncoder.field_value_size) does not know
# Float32Bit or BigDecimal, so those are only written outside arrays. Its BigDecimal encoder is
# lossy (BigDecimal("12.34") goes out as the decimal 12): the test compares what consumers decode,
# so that is the value every copy must keep. It reads every tag but B u i.
#
# bunny decodes b s I l to Integer, S and x to a binary String: the tag of each value is read from
# the header table's bytes (`FieldTags` below); the values are bunny's own decoding.
require "bunny"
require "json"
require "time"
require "bigdecimal"
require "bigdecimal/util"

$stdout.sync = true
Thread.abort_on_exception = true
Thread.report_on_exception = true

F32 = AMQ::Protocol::Float32Bit

def all_headers
  {
    "ruby.bool.true" => true,
    "ruby.bool.false" => false,
    "ruby.integer.int64-min" => -(2**63),
    "ruby.integer.int64-max" => (2**63) - 1,
    "ruby.integer.int32-min" => -(2**31),
    "ruby.integer.zero" => 0,
    "ruby.integer.small" => -7,
    "ruby.float.quarter" => 2.25,
    "ruby.float.tenth" => 0.1,
    "ruby.float.neg-zero" => -0.0,
    "ruby.float.tiny" => 5.0e-324,
    "ruby.float.max" => Float::MAX,
    "ruby.float.huge-neg" => -1.0e300,
    "ruby.float32.one-half" => F32.new(1.5),
    "ruby.float32.tenth" => F32.new(0.1),
    "ruby.float32.neg-zero" => F32.new(-0.0),
    "ruby.decimal.cents" => BigDecimal("12.34"),
    "ruby.decimal.small" => BigDecimal("0.05"),
    "ruby.decimal.int" => BigDecimal("7"),
    "ruby.time.2023" => Time.at(1_700_000_000),
    "ruby.time.epoch" => Time.at(0),
    "ruby.string.empty" => "",
    "ruby.string.utf8" => "naïve café 日本語 🐍",
    "ruby.symbol" => :a_symbol,
    "ruby.nil" => nil,
    "ruby.array.empty" => [],
    "ruby.hash.empty" => {},
    # bunny appends a header name to a binary buffer: a UTF-8 name that is not ASCII raises
    # Encoding::CompatibilityError unless it is given as bytes
    "ruby.ключ.naïve".b => "a header name that is not ASCII",
    "ruby.array.mixed" => [
      -1, 2**40, -(2**63), 0.5, -0.0, "s", "ü", true, false, nil, Time.at(86_400),
      { "k" => 2, "f" => 1.25 }, [], [[-1, "deep"]],
    ],
    "ruby.hash.nested" => {
      "int" => -5,
      "deep" => {
        "f32" => F32.new(-2.5),
        "dec" => BigDecimal("3"),
        "arr" => [1, "x", 2.5],
        "ts" => Time.at(1),
      },
      "empty" => {},
      "ключ".b => (2**63) - 1,
    },
  }
end

def binary_headers
  {
    "ruby.string.binary" => [0xff, 0x00, 0x80, 0xfe, 0x01, 0xc3].pack("C*"),
    "ruby.array.binary" => ["\xff\xfe".b, "ok"],
    "ruby.string.utf8" => "naïve",
  }
end

def publish_all(url, queues)
  conn = Bunny.new(url, automatically_recover: false, log_level: :warn)
  conn.start
  ch = conn.create_channel
  ch.confirm_select
  queues.each do |queue|
    { "ruby-all" => all_headers, "ruby-binary" => binary_headers }.each do |id, headers|
      ch.default_exchange.publish(
        '{"publisher": "ruby"}',
        routing_key: queue, message_id: id, content_type: "application/json",
        persistent: true, headers: headers
      )
    end
  end
  raise "publishes not confirmed" unless ch.wait_for_confirms

  conn.close
end

# The tags of a header table, read from its bytes: a tag, or [tag, children] for F and A.
module FieldTags
  FIXED = {
    "t" => 1, "b" => 1, "B" => 1, "s" => 2, "u" => 2, "I" => 4, "i" => 4, "l" => 8, "L" => 8,
    "f" => 4, "d" => 8, "D" => 5, "T" => 8, "V" => 0
  }.freeze

  def self.at(data, offset)
    tag = data.byteslice(offset, 1)
    offset += 1
    return [tag, offset + FIXED[tag]] if FIXED.key?(tag)

    len = data.byteslice(offset, 4).unpack1("N")
    body = data.byteslice(offset + 4, len)
    node = case tag
           when "S", "x" then tag
           when "F" then [tag, fields(body)]
           when "A" then [tag, items(body)]
           else raise ArgumentError, "unknown field tag #{tag.inspect}"
           end
    [node, offset + 4 + len]
  end

  def self.fields(body)
    out = {}
    offset = 0
    while offset < body.bytesize
      len = body.getbyte(offset)
      key = body.byteslice(offset + 1, len)
      out[key], offset = at(body, offset + 1 + len)
    end
    out
  end

  def self.items(body)
    out = []
    offset = 0
    while offset < body.bytesize
      node, offset = at(body, offset)
      out << node
    end
    out
  end
end

# AMQ::Protocol::Table.decode (header tables, nested ones too) keeps each table's tags beside it.
module RecordTags
  def decode(data)
    table = super
    tags = begin
      FieldTags.fields(data.byteslice(4, data.unpack1("N")))
    rescue StandardError => e
      { "?" => e.message }
    end
    table.instance_variable_set(:@field_tags, tags)
    table
  end
end

def text(bytes)
  s = bytes.dup.force_encoding("UTF-8")
  s.valid_encoding? ? s : "hex:#{bytes.unpack1('H*')}"
end

def cell(value, node)
  tag, sub = node.is_a?(Array) ? node : [node || "?", nil]
  type = "#{tag}/#{value.class.name}"
  canonical = case value
              when Hash then table(value, sub || {})
              when Array then value.each_with_index.map { |v, i| cell(v, sub && sub[i]) }
              when Time then value.to_i.to_s
              when BigDecimal then value.to_s("F")
              when String then text(value)
              when Integer, Float then value.to_s
              else value
              end
  { "type" => type, "value" => canonical }
end

def table(fields, nodes)
  fields.to_h { |k, v| [text(k.to_s), cell(v, nodes[k])] }
end

def consume_typed(url, queues)
  AMQ::Protocol::Table.singleton_class.prepend(RecordTags)
  conn = Bunny.new(url, automatically_recover: false, log_level: :warn)
  conn.start
  ch = conn.create_channel
  ch.prefetch(50)
  queues.each do |queue|
    ch.queue(queue, passive: true).subscribe(manual_ack: true, block: false) do |delivery, props, _|
      headers = props.headers || {}
      line = {
        "queue" => queue,
        "message_id" => props.message_id.to_s,
        "redelivered" => delivery.redelivered?,
        "headers" => table(headers, headers.instance_variable_get(:@field_tags) || {}),
      }
      puts JSON.generate(line)
      ch.reject(delivery.delivery_tag, false)
    rescue StandardError => e
      warn "CONSUMER FAILED: #{e.class}: #{e.message}"
      Process.exit!(2)
    end
  end
  puts '{"ready": true}'
  loop do
    sleep 0.2
    unless conn.open? && ch.open?
      warn "CONNECTION CLOSED: #{conn.status}"
      exit 2
    end
  end
end

mode, url, *rest = ARGV
begin
  case mode
  when "publish-all" then publish_all(url, rest.drop(1))
  when "consume-typed" then consume_typed(url, rest)
  else abort "usage: allfields.rb publish-all <url> <omit|-> <queue>... | consume-typed <url> <queue>..."
  end
rescue StandardError => e
  warn "CONNECTION CLOSED (error): #{e.class}: #{e.message}"
  exit 2
end
