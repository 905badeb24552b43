package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/e2e"
	"github.com/idempotency-lab/lab/lab/labtest"
	"github.com/idempotency-lab/lab/variants/memory"
	"github.com/idempotency-lab/lab/variants/postgres"
	"github.com/idempotency-lab/lab/variants/redis"
)

// benchmarkCharges measures POST /charges over loopback HTTP, the path a
// client takes: fresh keys charge, a repeated key replays.
func benchmarkCharges(b *testing.B, store lab.StoreName, fresh bool) {
	cfg := fullConfigB(b)
	a := labtest.Start(b, cfg)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	post := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, a.URL()+"/charges?store="+string(store), strings.NewReader(e2e.Body2500))
		req.Header.Set("Authorization", "Bearer "+labtest.Acme)
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body) // drained, so the connection is reused
		resp.Body.Close()
		return resp.StatusCode
	}
	post("replayed")
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		prefix := fmt.Sprintf("%p-", pb)
		for pb.Next() {
			key := "replayed"
			if fresh {
				i++
				key = prefix + fmt.Sprint(i)
			}
			if status := post(key); status != http.StatusCreated {
				b.Errorf("status %d", status)
			}
		}
	})
}

func fullConfigB(b *testing.B) app.Config {
	url, schema := labtest.Postgres(b)
	redisURL, prefix := labtest.Redis(b)
	return e2e.Config(func(c *app.Config) {
		c.DatabaseURL, c.PGSchema, c.RedisURL, c.RedisPrefix = url, schema, redisURL, prefix
	})
}

func BenchmarkPostChargesPostgresFresh(b *testing.B)  { benchmarkCharges(b, postgres.Name, true) }
func BenchmarkPostChargesPostgresReplay(b *testing.B) { benchmarkCharges(b, postgres.Name, false) }
func BenchmarkPostChargesRedisFresh(b *testing.B)     { benchmarkCharges(b, redis.Name, true) }
func BenchmarkPostChargesMemoryFresh(b *testing.B)    { benchmarkCharges(b, memory.Name, true) }
func BenchmarkPostChargesMemoryReplay(b *testing.B)   { benchmarkCharges(b, memory.Name, false) }
func BenchmarkPostChargesRedisReplay(b *testing.B)    { benchmarkCharges(b, redis.Name, false) }
