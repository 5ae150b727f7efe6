// A consumer that is not Celery, on Node's amqplib: it rejects every delivery with
// requeue=false and prints one JSON line per delivery (its decoded headers), so a test can
// check it decoded every copy celery_dlx republished. Any decode error ends the process.
//
//   node consumer.js <amqp-url> <queue>
'use strict';

const amqp = require('amqplib');

function fail(what, err) {
  process.stderr.write(`${what}: ${err && err.stack ? err.stack : err}\n`);
  process.exit(2);
}

process.on('uncaughtException', (err) => fail('CONNECTION CLOSED (uncaught)', err));
process.on('unhandledRejection', (err) => fail('CONNECTION CLOSED (unhandled)', err));

function plain(value) {
  // Buffers (field type x) as their bytes, typed values ({"!": "decimal"...}) as they are.
  if (Buffer.isBuffer(value)) return { '!': 'bytes', value: [...value] };
  if (Array.isArray(value)) return value.map(plain);
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, plain(v)]));
  }
  return value;
}

async function main() {
  const [url, queue] = process.argv.slice(2);
  const conn = await amqp.connect(url);
  conn.on('error', (err) => fail('CONNECTION CLOSED (error)', err));
  conn.on('close', (err) => fail('CONNECTION CLOSED', err || 'closed'));
  const ch = await conn.createChannel();
  ch.on('error', (err) => fail('CHANNEL CLOSED', err));
  await ch.prefetch(50);
  await ch.consume(queue, (msg) => {
    if (msg === null) fail('CONSUMER CANCELLED', queue);
    const headers = msg.properties.headers || {};
    const line = {
      message_id: msg.properties.messageId || '',
      redelivered: msg.fields.redelivered,
      headers: plain(headers),
      types: Object.fromEntries(
        Object.entries(headers).map(([k, v]) => [k, Array.isArray(v) ? 'array' : typeof v]),
      ),
      body: msg.content.toString('utf8'),
    };
    process.stdout.write(JSON.stringify(line) + '\n');
    ch.reject(msg, false);
  });
  process.stdout.write('{"ready": true}\n');
}

main().catch((err) => fail('startup', err));
