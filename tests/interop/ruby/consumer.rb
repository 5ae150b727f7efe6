# A consumer that is not Celery, on Ruby's bunny: it rejects every delivery with requeue=false
# and prints one JSON line per delivery (its decoded headers), so a test can check it decoded
# every copy celery_dlx republished. Any decode error ends the process.
#
#   ruby consumer.rb <amqp-url> <queue>
require "bunny"
require "json"
require "time"
# amq-protocol 2.3.2 decodes a decimal (D) with BigDecimal() without requiring it.
require "bigdecimal"
require "bigdecimal/util"

$stdout.sync = true
# A frame bunny cannot decode kills its reader thread: end the process, as the others do.
Thread.abort_on_exception = true
Thread.report_on_exception = true
url, queue = ARGV

def plain(value)
  case value
  when Hash then value.to_h { |k, v| [k, plain(v)] }
  when Array then value.map { |v| plain(v) }
  when Time then value.utc.iso8601
  when BigDecimal then value.to_s("F")
  when String then value.dup.force_encoding("UTF-8").valid_encoding? ? value : value.bytes
  else value
  end
end

def consumed(ch, delivery, props, body)
  headers = props.headers || {}
  line = {
    "message_id" => props.message_id.to_s,
    "redelivered" => delivery.redelivered?,
    "headers" => plain(headers),
    "types" => headers.to_h { |k, v| [k, v.class.name] },
    "body" => body.dup.force_encoding("UTF-8"),
  }
  puts JSON.generate(line)
  ch.reject(delivery.delivery_tag, false)
end

begin
  conn = Bunny.new(url, automatically_recover: false, log_level: :warn)
  conn.start
  ch = conn.create_channel
  ch.prefetch(50)
  q = ch.queue(queue, passive: true)
  q.subscribe(manual_ack: true, block: false) do |delivery, props, body|
    consumed(ch, delivery, props, body)
  rescue StandardError => e
    warn "CONSUMER FAILED: #{e.class}: #{e.message}"
    Process.exit!(2) # bunny would log a consumer's error and carry on
  end
  puts '{"ready": true}'
  loop do
    sleep 0.2
    unless conn.open? && ch.open?
      warn "CONNECTION CLOSED: #{conn.status}"
      exit 2
    end
  end
rescue StandardError => e
  warn "CONNECTION CLOSED (error): #{e.class}: #{e.message}"
  exit 2
end
