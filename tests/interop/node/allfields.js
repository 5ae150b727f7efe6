// Every field type amqplib writes, and a typed view of every header it reads (issue 21).
//
//   node allfields.js publish-all <amqp-url> <omit> <queue>...
//       publish one message "node-all" to each queue, its headers using every field type amqplib
//       writes, with boundary values; omit: field tags left out ("-" for none, "ui" for Go)
//   node allfields.js consume-typed <amqp-url> <queue>...
//       reject every delivery (requeue=false), printing per delivery a JSON line
//       {"queue", "message_id", "redelivered", "headers"} where headers maps each name to a cell
//       {"type": "<tag>/<JS type>", "value": <canonical value>}, recursing into tables and arrays
//
// amqplib writes all 17 tags RabbitMQ knows (t b B s u I i l f d D S x T F A V), the exotic ones
// only through its {'!': type, value} notation. It cannot write a negative timestamp (BigUInt64)
// nor a decimal with negative digits (UInt32); int64 beyond 2^53 needs a BigInt value.
//
// amqplib decodes b B s u I i l f d all to a JS number, so the tag of each value is read from the
// header table's bytes by `tags` below; the values are amqplib's own decoding.
'use strict';

const path = require('path');

function fail(what, err) {
  process.stderr.write(`${what}: ${err && err.stack ? err.stack : err}\n`);
  process.exit(2);
}

process.on('uncaughtException', (err) => fail('CONNECTION CLOSED (uncaught)', err));
process.on('unhandledRejection', (err) => fail('CONNECTION CLOSED (unhandled)', err));

const typed = (type, value) => ({ '!': type, value });

function allHeaders() {
  return {
    'node.bool.true': true,
    'node.bool.false': false,
    'node.int8.min': typed('int8', -128),
    'node.int8.max': typed('int8', 127),
    'node.uint8.min': typed('uint8', 0),
    'node.uint8.max': typed('uint8', 255),
    'node.int16.min': typed('int16', -32768),
    'node.int16.max': typed('int16', 32767),
    'node.uint16.min': typed('uint16', 0),
    'node.uint16.max': typed('uint16', 65535),
    'node.int32.min': typed('int32', -2147483648),
    'node.int32.max': typed('int32', 2147483647),
    'node.uint32.min': typed('uint32', 0),
    'node.uint32.max': typed('uint32', 4294967295),
    'node.int64.min': typed('int64', -9223372036854775808n),
    'node.int64.max': typed('int64', 9223372036854775807n),
    'node.int64.small': typed('int64', 7),
    // untyped numbers: amqplib picks b, s, I, l or d
    'node.number.byte': 1,
    'node.number.short': -300,
    'node.number.int': 70000,
    'node.number.long': 2 ** 40,
    'node.number.double': 0.5,
    'node.float.one-half': typed('float', 1.5),
    'node.float.tenth': typed('float', 0.1),
    'node.float.neg-zero': typed('float', -0),
    'node.float.tiny': typed('float', 1.401298464324817e-45),
    'node.float.max': typed('float', 3.4028234663852886e38),
    'node.double.quarter': typed('double', 2.25),
    'node.double.neg-zero': typed('double', -0),
    'node.double.tiny': typed('double', 5e-324),
    'node.double.max': typed('double', 1.7976931348623157e308),
    'node.double.huge-neg': typed('double', -1e300),
    'node.decimal.int': typed('decimal', { places: 0, digits: 7 }),
    'node.decimal.cents': typed('decimal', { places: 2, digits: 12345 }),
    'node.decimal.trailing': typed('decimal', { places: 2, digits: 150 }),
    'node.decimal.max': typed('decimal', { places: 9, digits: 4294967295 }),
    'node.timestamp.2023': typed('timestamp', 1700000000),
    'node.timestamp.epoch': typed('timestamp', 0),
    'node.string.empty': '',
    'node.string.utf8': 'naïve café 日本語 🐍',
    'node.buffer.empty': Buffer.alloc(0),
    'node.buffer.binary': Buffer.from([0xff, 0x00, 0x80, 0xfe, 0x01, 0xc3]),
    'node.null': null,
    'node.array.empty': [],
    'node.table.empty': {},
    'node.ключ.naïve': 'a header name that is not ASCII',
    'node.array.mixed': [
      typed('int8', -1),
      typed('uint8', 200),
      typed('int16', -300),
      typed('uint16', 60000),
      typed('int32', -70000),
      typed('uint32', 3000000000),
      typed('int64', 2 ** 40),
      typed('float', 0.5),
      -2.5,
      typed('decimal', { places: 3, digits: 1234 }),
      's',
      Buffer.from([0xff, 0x00]),
      true,
      null,
      typed('timestamp', 86400),
      { k: typed('int16', 2), bytes: Buffer.from([0x80]) },
      [],
      [[typed('int64', -1), 'deep']],
    ],
    'node.table.nested': {
      int8: typed('int8', -5),
      bytes: Buffer.from([0x00, 0xff]),
      deep: {
        f32: typed('float', -2.5),
        arr: [typed('uint8', 1), 'x', typed('decimal', { places: 1, digits: 5 })],
        ts: typed('timestamp', 1),
        u32: typed('uint32', 4294967295),
      },
      empty: {},
      ключ: typed('int64', -9223372036854775808n),
    },
  };
}

// The tag amqplib writes for a value (as its encodeFieldValue picks it).
const TYPE_TAGS = {
  double: 'd', float64: 'd', byte: 'b', int8: 'b', unsignedbyte: 'B', uint8: 'B', short: 's',
  int16: 's', unsignedshort: 'u', uint16: 'u', int: 'I', int32: 'I', unsignedint: 'i',
  uint32: 'i', long: 'l', int64: 'l', timestamp: 'T', float: 'f', decimal: 'D',
};

function tagOf(value) {
  if (value === null) return 'V';
  if (Array.isArray(value)) return 'A';
  if (Buffer.isBuffer(value)) return 'x';
  if (typeof value === 'object' && Object.hasOwn(value, '!')) return TYPE_TAGS[value['!']];
  if (typeof value === 'object') return 'F';
  if (typeof value === 'string') return 'S';
  if (typeof value === 'boolean') return 't';
  return 'number'; // guessed by amqplib: b s I l d (never one of u, i, B)
}

function without(value, omit) {
  const keep = (v) => !omit.includes(tagOf(v));
  if (Array.isArray(value)) return value.filter(keep).map((v) => without(v, omit));
  if (value && typeof value === 'object' && !Buffer.isBuffer(value) && !Object.hasOwn(value, '!')) {
    return Object.fromEntries(
      Object.entries(value)
        .filter(([, v]) => keep(v))
        .map(([k, v]) => [k, without(v, omit)]),
    );
  }
  return value;
}

// -- the tags of a header table, from its bytes ---------------------------------------------

const FIXED = { t: 1, b: 1, B: 1, s: 2, u: 2, I: 4, i: 4, l: 8, L: 8, f: 4, d: 8, D: 5, T: 8, V: 0 };

// One value's tag node at `offset`: a tag, or [tag, children] for F and A; and the next offset.
function tagAt(buf, offset) {
  const t = String.fromCharCode(buf[offset]);
  offset += 1;
  if (Object.hasOwn(FIXED, t)) return [t, offset + FIXED[t]];
  if (t === 'S' || t === 'x') return [t, offset + 4 + buf.readUInt32BE(offset)];
  if (t === 'F' || t === 'A') {
    const len = buf.readUInt32BE(offset);
    const body = buf.subarray(offset + 4, offset + 4 + len);
    return [[t, t === 'F' ? tags(body) : arrayTags(body)], offset + 4 + len];
  }
  throw new Error(`unknown field tag ${JSON.stringify(t)}`);
}

function tags(buf) {
  const out = {};
  let offset = 0;
  while (offset < buf.length) {
    const len = buf.readUInt8(offset);
    const key = buf.toString('utf8', offset + 1, offset + 1 + len);
    [out[key], offset] = tagAt(buf, offset + 1 + len);
  }
  return out;
}

function arrayTags(buf) {
  const out = [];
  let offset = 0;
  while (offset < buf.length) {
    let node;
    [node, offset] = tagAt(buf, offset);
    out.push(node);
  }
  return out;
}

const TAGS = Symbol('field tags');

// amqplib's decoder of field tables, wrapped to keep each table's tags beside it. defs.js reads
// codec.decodeFields once, when it is loaded: this runs before amqplib is required.
function recordTags() {
  const codec = require(path.join(path.dirname(require.resolve('amqplib')), 'lib', 'codec.js'));
  const decode = codec.decodeFields;
  codec.decodeFields = (slice) => {
    const fields = decode(slice);
    let found;
    try {
      found = tags(slice);
    } catch (err) {
      found = { '?': String(err) };
    }
    Object.defineProperty(fields, TAGS, { value: found, enumerable: false });
    return fields;
  };
}

// -- canonical cells ------------------------------------------------------------------------

function number(n) {
  return Object.is(n, -0) ? '-0' : String(n);
}

function cell(value, node) {
  const tag = Array.isArray(node) ? node[0] : node || '?';
  const sub = Array.isArray(node) ? node[1] : undefined;
  if (value === null) return { type: `${tag}/null`, value: null };
  if (Buffer.isBuffer(value)) return { type: `${tag}/Buffer`, value: `hex:${value.toString('hex')}` };
  if (Array.isArray(value)) {
    return { type: `${tag}/array`, value: value.map((v, i) => cell(v, sub && sub[i])) };
  }
  if (typeof value === 'object' && value['!'] === 'decimal') {
    return { type: `${tag}/decimal`, value: `${value.value.digits}e-${value.value.places}` };
  }
  if (typeof value === 'object' && value['!'] === 'timestamp') {
    return { type: `${tag}/timestamp`, value: number(value.value) };
  }
  if (typeof value === 'object') return { type: `${tag}/object`, value: table(value, sub || {}) };
  if (typeof value === 'number') return { type: `${tag}/number`, value: number(value) };
  return { type: `${tag}/${typeof value}`, value };
}

function table(fields, nodes) {
  return Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, cell(v, nodes[k])]));
}

// -- modes ----------------------------------------------------------------------------------

async function publishAll(url, omit, queues) {
  const amqp = require('amqplib');
  const conn = await amqp.connect(url);
  const ch = await conn.createConfirmChannel();
  const headers = without(allHeaders(), omit === '-' ? '' : omit);
  for (const queue of queues) {
    ch.sendToQueue(queue, Buffer.from('{"publisher": "node"}'), {
      messageId: 'node-all',
      contentType: 'application/json',
      persistent: true,
      headers,
    });
  }
  await ch.waitForConfirms();
  await conn.close();
}

async function consumeTyped(url, queues) {
  recordTags();
  const amqp = require('amqplib');
  const conn = await amqp.connect(url);
  conn.on('error', (err) => fail('CONNECTION CLOSED (error)', err));
  conn.on('close', (err) => fail('CONNECTION CLOSED', err || 'closed'));
  const ch = await conn.createChannel();
  ch.on('error', (err) => fail('CHANNEL CLOSED', err));
  await ch.prefetch(50);
  for (const queue of queues) {
    await ch.consume(queue, (msg) => {
      if (msg === null) fail('CONSUMER CANCELLED', queue);
      const headers = msg.properties.headers || {};
      const line = {
        queue,
        message_id: msg.properties.messageId || '',
        redelivered: msg.fields.redelivered,
        headers: table(headers, headers[TAGS] || {}),
      };
      process.stdout.write(JSON.stringify(line) + '\n');
      ch.reject(msg, false);
    });
  }
  process.stdout.write('{"ready": true}\n');
}

async function main(argv) {
  const [mode, url, ...rest] = argv;
  if (mode === 'publish-all' && rest.length >= 2) return publishAll(url, rest[0], rest.slice(1));
  if (mode === 'consume-typed' && rest.length >= 1) return consumeTyped(url, rest);
  fail('usage', 'allfields.js publish-all <url> <omit|-> <queue>... | consume-typed <url> <queue>...');
}

main(process.argv.slice(2)).catch((err) => fail('startup', err));
