// The labels service: a Go consumer that knows nothing of Celery or celery_dlx.
//
// It declares its queue with a dead-letter exchange (two queue arguments), prints shipping
// labels for JSON events {"order_id": "A-2001", "carrier": "DHL"}, and rejects (requeue=false)
// an event naming a carrier it does not know. celery_dlx's DLX service does the rest: requeue,
// park in Redis, bury in the graveyard. The copies it sends back carry x-dlx-* headers this
// service may read (x-dlx-attempt: the failed runs so far) and can always decode.
//
//	labels                         consume <run>.labels until interrupted
//	labels publish <order> <carrier>  publish one event to <run>.labels
//
// Build with Debian's packages, no network (golang-go, golang-github-rabbitmq-amqp091-go-dev):
//
//	GOPATH=/usr/share/gocode GO111MODULE=off go build -o /tmp/labels example_project/go/labels.go
//
// EXAMPLE_RUN and EXAMPLE_BROKER_URL name the run and the broker, as for the Python demo.
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

var carriers = map[string]bool{"DHL": true, "UPS": true}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func main() {
	run := env("EXAMPLE_RUN", "example")
	url := strings.Replace(env("EXAMPLE_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"), "5672//", "5672/%2F", 1)
	queue := run + ".labels"
	conn, err := amqp.Dial(url)
	if err != nil {
		log.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatalf("channel: %v", err)
	}
	// All a service in any language needs for celery_dlx: where its rejects go.
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    run + ".dlx",
		"x-dead-letter-routing-key": queue,
		"x-expires":                 int32(24 * 3600 * 1000),
	})
	if err != nil {
		log.Fatalf("declare: %v", err)
	}
	if len(os.Args) == 4 && os.Args[1] == "publish" {
		body, _ := json.Marshal(map[string]string{"order_id": os.Args[2], "carrier": os.Args[3]})
		err = ch.Publish("", queue, false, false, amqp.Publishing{
			MessageId: "label-" + os.Args[2], ContentType: "application/json",
			DeliveryMode: amqp.Persistent, Body: body,
		})
		if err != nil {
			log.Fatalf("publish: %v", err)
		}
		return
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		log.Fatalf("consume: %v", err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt)
	fmt.Printf("[labels] consuming %s\n", queue)
	for {
		select {
		case d := <-deliveries:
			var event struct {
				OrderID string `json:"order_id"`
				Carrier string `json:"carrier"`
			}
			attempt := d.Headers["x-dlx-attempt"] // int32 on copies celery_dlx sent back
			if json.Unmarshal(d.Body, &event) != nil || !carriers[event.Carrier] {
				fmt.Printf("[labels] %s: no carrier %q, rejecting (x-dlx-attempt=%v)\n",
					d.MessageId, event.Carrier, attempt)
				d.Reject(false)
				continue
			}
			fmt.Printf("[labels] label printed for %s via %s\n", event.OrderID, event.Carrier)
			d.Ack(false)
		case e := <-closed:
			log.Fatalf("connection closed: %v", e)
		case <-stop:
			return
		}
	}
}
