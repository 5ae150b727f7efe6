// A consumer that is not Celery, on RabbitMQ's own Go client (github.com/rabbitmq/amqp091-go):
// it rejects every delivery with requeue=false and prints one JSON line per delivery (headers
// and their Go types), so a test can check it decoded every copy celery_dlx republished.
//
//	consumer consume <amqp-url> <queue>      reject everything, until killed or the connection dies
//	consumer publish <amqp-url> <queue> <n> [no-byte]
//	                                          publish n messages whose headers use Go's field types
//	                                          (no-byte: without a byte 'B', which bunny cannot read)
//	consumer publish-all|publish-hostile|consume-typed ...
//	                                          every field type and a typed view (allfields.go)
//
// Built in GOPATH mode from Debian's golang-github-rabbitmq-amqp091-go-dev, no network:
// GOPATH=/usr/share/gocode GO111MODULE=off go build -o /tmp/consumer consumer.go allfields.go
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(2)
}

// types names the Go type of every header value, nested ones as "[]interface {}" / "amqp.Table".
func types(headers amqp.Table) map[string]string {
	out := map[string]string{}
	for k, v := range headers {
		out[k] = fmt.Sprintf("%T", v)
	}
	return out
}

func consume(url, queue string) {
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
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		fail("consume: %v", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	fmt.Println(`{"ready": true}`)
	out := json.NewEncoder(os.Stdout)
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				fail("CONNECTION CLOSED: deliveries channel closed: %v", <-closed)
			}
			line := map[string]interface{}{
				"message_id":  d.MessageId,
				"redelivered": d.Redelivered,
				"headers":     d.Headers,
				"types":       types(d.Headers),
				"body":        string(d.Body),
			}
			if err := out.Encode(line); err != nil {
				fail("encode: %v", err)
			}
			if err := d.Reject(false); err != nil {
				fail("reject: %v", err)
			}
		case e := <-closed:
			fail("CONNECTION CLOSED: %v", e)
		}
	}
}

func publish(url, queue string, n int, withByte bool) {
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
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, n))
	now := time.Now()
	for i := 0; i < n; i++ {
		headers := amqp.Table{
			"go-int64":   now.UnixMilli(), // 'l': py-amqp reads it, and would write it back as 'L'
			"go-int32":   int32(-7),
			"go-int16":   int16(-3),
			"go-int8":    int8(-1),
			"go-byte":    byte(200),
			"go-float32": float32(1.5),
			"go-float64": 2.25,
			"go-decimal": amqp.Decimal{Scale: 2, Value: 12345},
			"go-time":    now.Truncate(time.Second),
			"go-bytes":   []byte{0, 255, 16},
			"go-bool":    true,
			"go-void":    nil,
			"go-nested": []interface{}{
				now.UnixMilli(),
				amqp.Table{"at": now.UnixMilli(), "ok": false},
				[]interface{}{[]interface{}{int64(1) << 40}},
			},
			"go-table": amqp.Table{"deep": amqp.Table{"ms": now.UnixMilli()}},
		}
		if !withByte {
			delete(headers, "go-byte")
		}
		msg := amqp.Publishing{
			MessageId:    "go-" + strconv.Itoa(i),
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			Timestamp:    now,
			Headers:      headers,
			Body:         []byte(fmt.Sprintf(`{"n": %d}`, i)),
		}
		if err := ch.Publish("", queue, false, false, msg); err != nil {
			fail("publish: %v", err)
		}
	}
	for i := 0; i < n; i++ {
		if c := <-confirms; !c.Ack {
			fail("publish %d not confirmed", c.DeliveryTag)
		}
	}
}

func main() {
	if len(os.Args) > 1 && typedMain(os.Args[1], os.Args[2:]) {
		return
	}
	if len(os.Args) < 4 || (os.Args[1] == "publish" && len(os.Args) < 5) {
		fail("usage: consumer consume <url> <queue> | consumer publish <url> <queue> <n> [no-byte]")
	}
	switch os.Args[1] {
	case "consume":
		consume(os.Args[2], os.Args[3])
	case "publish":
		n, err := strconv.Atoi(os.Args[4])
		if err != nil {
			fail("n: %v", err)
		}
		publish(os.Args[2], os.Args[3], n, len(os.Args) < 6 || os.Args[5] != "no-byte")
	default:
		fail("unknown mode %q", os.Args[1])
	}
}
