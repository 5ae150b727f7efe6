// Every field type amqp091-go writes, and a typed view of every header it reads (issue 21).
//
//	consumer publish-all <amqp-url> <omit> <queue>...
//	    publish one message "go-all" to each queue, its headers using every field type Go writes,
//	    with boundary values; omit: field tags left out ("B" for a bunny consumer, "-" for none)
//	consumer publish-hostile <amqp-url> <queue>
//	    publish "go-hostile-1969" (a timestamp of time.Unix(-86400, 0), written as the uint64
//	    wrap-around) and "go-hostile-10000" (a timestamp in the year 10000)
//	consumer consume-typed <amqp-url> <queue>...
//	    reject every delivery (requeue=false), printing per delivery a JSON line
//	    {"queue", "message_id", "redelivered", "headers"} where headers maps each name to a cell
//	    {"type": "<tag>/<Go type>", "value": <canonical value>}, recursing into tables and arrays
//
// amqp091-go writes t B b s I l f d D S A T F x V (int as I too). It cannot write u, i (no
// uint16/uint32 case: ErrFieldType) nor read them (ErrSyntax closes the connection).
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"
)

// allHeaders is one header of every type Go writes, with boundary values.
func allHeaders() amqp.Table {
	negZero32 := float32(math.Copysign(0, -1))
	return amqp.Table{
		"go.bool.true":        true,
		"go.bool.false":       false,
		"go.uint8.min":        uint8(0),
		"go.uint8.max":        uint8(math.MaxUint8),
		"go.int8.min":         int8(math.MinInt8),
		"go.int8.max":         int8(math.MaxInt8),
		"go.int16.min":        int16(math.MinInt16),
		"go.int16.max":        int16(math.MaxInt16),
		"go.int32.min":        int32(math.MinInt32),
		"go.int32.max":        int32(math.MaxInt32),
		"go.int32.minus-one":  int32(-1),
		"go.int.small":        int(5),
		"go.int64.min":        int64(math.MinInt64),
		"go.int64.max":        int64(math.MaxInt64),
		"go.int64.zero":       int64(0),
		"go.int64.small":      int64(-7),
		"go.int64.epoch-ms":   int64(1700000000123),
		"go.float32.one-half": float32(1.5),
		"go.float32.tenth":    float32(0.1),
		"go.float32.neg-zero": negZero32,
		"go.float32.tiny":     float32(math.SmallestNonzeroFloat32),
		"go.float32.max":      float32(math.MaxFloat32),
		"go.float32.min":      float32(-math.MaxFloat32),
		"go.float64.quarter":  2.25,
		"go.float64.tenth":    0.1,
		"go.float64.neg-zero": math.Copysign(0, -1),
		"go.float64.tiny":     math.SmallestNonzeroFloat64,
		"go.float64.max":      math.MaxFloat64,
		"go.float64.huge-neg": -1e300,
		"go.decimal.int":      amqp.Decimal{Scale: 0, Value: 7},
		"go.decimal.cents":    amqp.Decimal{Scale: 2, Value: 12345},
		"go.decimal.trailing": amqp.Decimal{Scale: 2, Value: 150},
		"go.decimal.negative": amqp.Decimal{Scale: 3, Value: -12345},
		"go.decimal.max":      amqp.Decimal{Scale: 9, Value: math.MaxInt32},
		"go.decimal.min":      amqp.Decimal{Scale: 0, Value: math.MinInt32},
		"go.time.2023":        time.Unix(1700000000, 0),
		"go.time.epoch":       time.Unix(0, 0),
		"go.string.empty":     "",
		"go.string.ascii":     "plain text",
		"go.string.utf8":      "naïve café 日本語 🐍",
		"go.bytes.empty":      []byte{},
		"go.bytes.binary":     []byte{0xff, 0x00, 0x80, 0xfe, 0x01, 0xc3},
		"go.bytes.utf8":       []byte("looks like text"),
		"go.void":             nil,
		"go.array.empty":      []interface{}{},
		"go.table.empty":      amqp.Table{},
		"go.ключ.naïve":       "a header name that is not ASCII",
		"go.array.mixed": []interface{}{
			int8(-1), uint8(200), int16(-300), int32(-70000), int(70000), int64(1) << 40,
			float32(0.5), -2.5, amqp.Decimal{Scale: 3, Value: 1234}, "s", "ü",
			[]byte{0xff, 0x00}, true, false, nil, time.Unix(86400, 0),
			amqp.Table{"k": int16(2), "bytes": []byte{0x80}},
			[]interface{}{}, []interface{}{[]interface{}{int64(-1), "deep"}},
		},
		"go.table.nested": amqp.Table{
			"int8":  int8(-5),
			"bytes": []byte{0x00, 0xff},
			"deep": amqp.Table{
				"f32": float32(-2.5),
				"arr": []interface{}{uint8(1), "x", amqp.Decimal{Scale: 1, Value: 5}},
				"ts":  time.Unix(1, 0),
			},
			"empty": amqp.Table{},
			"ключ":  int64(math.MinInt64),
		},
	}
}

// hostileHeaders are valid timestamps py-amqp cannot turn into a datetime.
func hostileHeaders(name string) amqp.Table {
	at := time.Unix(-86400, 0) // amqp091-go writes uint64(v.Unix()): 2^64 - 86400
	if name == "10000" {
		at = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return amqp.Table{
		"go.time.hostile": at,
		"go.hostile.in":   amqp.Table{"ts": at, "list": []interface{}{at, int64(1)}},
		"go.int64.max":    int64(math.MaxInt64),
		"go.string.utf8":  "naïve",
	}
}

// tag is the field tag amqp091-go writes for a value (every Go type it reads maps to one tag).
func tag(v interface{}) string {
	switch v.(type) {
	case bool:
		return "t"
	case uint8:
		return "B"
	case int8:
		return "b"
	case int16:
		return "s"
	case int, int32:
		return "I"
	case int64:
		return "l"
	case float32:
		return "f"
	case float64:
		return "d"
	case amqp.Decimal:
		return "D"
	case string:
		return "S"
	case []byte:
		return "x"
	case time.Time:
		return "T"
	case amqp.Table:
		return "F"
	case []interface{}:
		return "A"
	case nil:
		return "V"
	}
	return "?"
}

// without is v with every value of an omitted tag left out, nested ones too.
func without(v interface{}, omit string) interface{} {
	switch x := v.(type) {
	case amqp.Table:
		out := amqp.Table{}
		for k, e := range x {
			if !strings.Contains(omit, tag(e)) {
				out[k] = without(e, omit)
			}
		}
		return out
	case []interface{}:
		out := []interface{}{}
		for _, e := range x {
			if !strings.Contains(omit, tag(e)) {
				out = append(out, without(e, omit))
			}
		}
		return out
	}
	return v
}

func text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return "hex:" + hex.EncodeToString([]byte(s))
}

// cell is a header value as {"type": "<tag>/<Go type>", "value": canonical}.
func cell(v interface{}) map[string]interface{} {
	var value interface{}
	switch x := v.(type) {
	case bool:
		value = x
	case uint8:
		value = strconv.FormatUint(uint64(x), 10)
	case int8, int16, int, int32, int64:
		value = fmt.Sprintf("%d", x)
	case float32:
		value = strconv.FormatFloat(float64(x), 'g', -1, 32)
	case float64:
		value = strconv.FormatFloat(x, 'g', -1, 64)
	case amqp.Decimal:
		value = fmt.Sprintf("%de-%d", x.Value, x.Scale)
	case string:
		value = text(x)
	case []byte:
		value = "hex:" + hex.EncodeToString(x)
	case time.Time:
		value = strconv.FormatInt(x.Unix(), 10)
	case amqp.Table:
		fields := map[string]interface{}{}
		for k, e := range x {
			fields[text(k)] = cell(e)
		}
		value = fields
	case []interface{}:
		items := []interface{}{}
		for _, e := range x {
			items = append(items, cell(e))
		}
		value = items
	case nil:
		value = nil
	default:
		value = fmt.Sprintf("%v", x)
	}
	return map[string]interface{}{"type": fmt.Sprintf("%s/%T", tag(v), v), "value": value}
}

func typedHeaders(headers amqp.Table) map[string]interface{} {
	out := map[string]interface{}{}
	for k, v := range headers {
		out[text(k)] = cell(v)
	}
	return out
}

func publishAll(url, omit string, queues []string, messages map[string]amqp.Table) {
	conn, err := amqp.Dial(url)
	if err != nil {
		fail("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		fail("channel: %v", err)
	}
	if err := ch.Confirm(false); err != nil {
		fail("confirm: %v", err)
	}
	n := len(queues) * len(messages)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	ids := make([]string, 0, len(messages))
	for id := range messages {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, queue := range queues {
		for _, id := range ids {
			msg := amqp.Publishing{
				MessageId:    id,
				ContentType:  "application/json",
				DeliveryMode: amqp.Persistent,
				Headers:      without(messages[id], omit).(amqp.Table),
				Body:         []byte(`{"publisher": "go"}`),
			}
			if err := ch.Publish("", queue, false, false, msg); err != nil {
				fail("publish: %v", err)
			}
		}
	}
	for i := 0; i < n; i++ {
		if c := <-confirms; !c.Ack {
			fail("publish %d not confirmed", c.DeliveryTag)
		}
	}
}

func consumeTyped(url string, queues []string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		fail("dial: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		fail("channel: %v", err)
	}
	if err := ch.Qos(50, 0, false); err != nil {
		fail("qos: %v", err)
	}
	type delivery struct {
		queue string
		d     amqp.Delivery
	}
	all := make(chan delivery)
	for _, queue := range queues {
		deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			fail("consume %s: %v", queue, err)
		}
		go func(queue string, deliveries <-chan amqp.Delivery) {
			for d := range deliveries {
				all <- delivery{queue, d}
			}
		}(queue, deliveries)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	fmt.Println(`{"ready": true}`)
	out := json.NewEncoder(os.Stdout)
	for {
		select {
		case got := <-all:
			line := map[string]interface{}{
				"queue":       got.queue,
				"message_id":  got.d.MessageId,
				"redelivered": got.d.Redelivered,
				"headers":     typedHeaders(got.d.Headers),
			}
			if err := out.Encode(line); err != nil {
				fail("encode: %v", err)
			}
			if err := got.d.Reject(false); err != nil {
				fail("reject: %v", err)
			}
		case e := <-closed:
			fail("CONNECTION CLOSED: %v", e)
		}
	}
}

// typedMain runs the modes of this file; false if mode is not one of them.
func typedMain(mode string, args []string) bool {
	switch mode {
	case "publish-all":
		if len(args) < 3 {
			fail("usage: consumer publish-all <url> <omit|-> <queue>...")
		}
		publishAll(args[0], args[1], args[2:], map[string]amqp.Table{"go-all": allHeaders()})
	case "publish-hostile":
		if len(args) != 2 {
			fail("usage: consumer publish-hostile <url> <queue>")
		}
		publishAll(args[0], "-", args[1:], map[string]amqp.Table{
			"go-hostile-1969":  hostileHeaders("1969"),
			"go-hostile-10000": hostileHeaders("10000"),
		})
	case "consume-typed":
		if len(args) < 2 {
			fail("usage: consumer consume-typed <url> <queue>...")
		}
		consumeTyped(args[0], args[1:])
	default:
		return false
	}
	return true
}
