// The Go side of benches/workers_side_by_side.rs: the Go SDK's own worker
// (its App runtime, idempotency.Wrap and its Redis seen-set store) on Redis
// or RabbitMQ, and the raw go-redis / amqp091-go loops that are the
// client's ceiling. The benchmark writes the go.mod that builds it (see
// benches/README.md); nothing of the SDK is copied here.
//
//	worker     -broker redis|amqp -url URL -queue Q -store REDIS_URL
//	           drains Q with one App (one message at a time, as the SDK's
//	           App consumes), every message through idempotency.Wrap over the
//	           SDK's Redis store (EXISTS / SET NX on bq:idemp:<id>)
//	raw-redis  -url URL -queue Q -batch B
//	           drains Q with the commands the SDK's worker sends (LMOVE,
//	           EXISTS, SET NX, LREM), B messages per pipelined round trip
//	raw-amqp   -url URL -queue Q -prefetch P -n N
//	           consumes N messages with prefetch P and acks each
//
// Each prints one JSON line: {"processed":N}.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	babelqueue "github.com/babelqueue/babelqueue-go"
	bqamqp "github.com/babelqueue/babelqueue-go/amqp"
	"github.com/babelqueue/babelqueue-go/idempotency"
	idemredis "github.com/babelqueue/babelqueue-go/idempotency-redis"
	bqredis "github.com/babelqueue/babelqueue-go/redis"
	amqp091 "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
)

const urn = "urn:babel:interop:created"

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: go_workers worker|raw-redis|raw-amqp [flags]"))
	}
	mode, args := os.Args[1], os.Args[2:]
	flags := flag.NewFlagSet(mode, flag.ExitOnError)
	broker := flags.String("broker", "redis", "redis or amqp")
	url := flags.String("url", "", "the broker's URL")
	queue := flags.String("queue", "", "the queue")
	store := flags.String("store", "", "the seen-set's Redis URL")
	batch := flags.Int("batch", 16, "raw-redis: messages per pipelined round trip")
	prefetch := flags.Int("prefetch", 64, "raw-amqp: prefetch")
	count := flags.Int("n", 0, "raw-amqp: messages to consume")
	_ = flags.Parse(args)

	ctx := context.Background()
	var processed int
	var err error
	switch mode {
	case "worker":
		processed, err = worker(ctx, *broker, *url, *queue, *store)
	case "raw-redis":
		processed, err = rawRedis(ctx, *url, *queue, *batch)
	case "raw-amqp":
		processed, err = rawAMQP(*url, *queue, *prefetch, *count)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fail(err)
	}
	fmt.Printf("{\"processed\":%d}\n", processed)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "go_workers:", err)
	os.Exit(1)
}

// worker drains queue with the SDK's App: Drain stops at the first empty
// poll, which waits a second (go-redis's shortest blocking timeout).
func worker(ctx context.Context, broker, url, queue, storeURL string) (int, error) {
	var transport babelqueue.Transport
	switch broker {
	case "redis":
		t, err := bqredis.New(url)
		if err != nil {
			return 0, err
		}
		defer t.Close()
		transport = t
	case "amqp":
		t := bqamqp.New(url)
		defer t.Close()
		transport = t
	default:
		return 0, fmt.Errorf("unknown broker %q", broker)
	}
	store, err := idemredis.New(storeURL)
	if err != nil {
		return 0, err
	}
	defer store.Close()
	app := babelqueue.NewApp(transport,
		babelqueue.WithDefaultQueue(queue),
		babelqueue.WithPollTimeout(time.Second))
	app.Handle(urn, idempotency.Wrap(store, func(ctx context.Context, env babelqueue.Envelope) error {
		return nil
	}))
	return app.Drain(ctx, queue, 0)
}

// rawRedis: per round trip, B LMOVEs; then per round trip, for the values
// moved, EXISTS and SET NX of their ids' keys and LREM of the values.
func rawRedis(ctx context.Context, url, queue string, batch int) (int, error) {
	options, err := goredis.ParseURL(url)
	if err != nil {
		return 0, err
	}
	client := goredis.NewClient(options)
	defer client.Close()
	processing := queue + ":processing"
	processed := 0
	for {
		pipe := client.Pipeline()
		moves := make([]*goredis.StringCmd, batch)
		for i := range moves {
			moves[i] = pipe.LMove(ctx, queue, processing, "LEFT", "RIGHT")
		}
		_, _ = pipe.Exec(ctx)
		values := make([]string, 0, batch)
		for _, move := range moves {
			if value, err := move.Result(); err == nil {
				values = append(values, value)
			}
		}
		if len(values) == 0 {
			return processed, nil
		}
		pipe = client.Pipeline()
		for _, value := range values {
			key := "bq:idemp:" + idOf(value)
			pipe.Exists(ctx, key)
			pipe.SetNX(ctx, key, "1", 0)
			pipe.LRem(ctx, processing, 1, value)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return processed, err
		}
		processed += len(values)
	}
}

// idOf finds meta.id without decoding the JSON, as the Rust loop does.
func idOf(body string) string {
	const marker = `"id":"`
	for i := 0; i+len(marker) <= len(body); i++ {
		if body[i:i+len(marker)] == marker {
			start := i + len(marker)
			for j := start; j < len(body); j++ {
				if body[j] == '"' {
					return body[start:j]
				}
			}
		}
	}
	return ""
}

func rawAMQP(url, queue string, prefetch, count int) (int, error) {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return 0, err
	}
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	processed := 0
	for processed < count {
		delivery, ok := <-deliveries
		if !ok {
			return processed, fmt.Errorf("the channel closed after %d", processed)
		}
		if err := delivery.Ack(false); err != nil {
			return processed, err
		}
		processed++
	}
	return processed, nil
}
