package app_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idempotency-lab/lab/lab"
	"github.com/idempotency-lab/lab/lab/app"
	"github.com/idempotency-lab/lab/lab/labtest"
)

// benchmarkCharges measures POST /charges over loopback HTTP, the path a
// client takes: fresh keys charge, a repeated key replays.
func benchmarkCharges(b *testing.B, store string, fresh bool) {
	cfg := fullConfigB(b)
	a := labtest.Start(b, cfg)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	post := func(key string) int {
		req, _ := http.NewRequest(http.MethodPost, a.URL()+"/charges?store="+store, strings.NewReader(body2500))
		req.Header.Set("Authorization", "Bearer "+labtest.Acme)
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
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

func fullConfigB(b *testing.B) (cfg app.Config) {
	url, schema := labtest.Postgres(b)
	redisURL, prefix := labtest.Redis(b)
	cfg.DatabaseURL, cfg.PGSchema, cfg.RedisURL, cfg.RedisPrefix = url, schema, redisURL, prefix
	return cfg
}

func BenchmarkPostChargesPostgresFresh(b *testing.B)  { benchmarkCharges(b, lab.StorePostgres, true) }
func BenchmarkPostChargesPostgresReplay(b *testing.B) { benchmarkCharges(b, lab.StorePostgres, false) }
func BenchmarkPostChargesRedisFresh(b *testing.B)     { benchmarkCharges(b, lab.StoreRedis, true) }
func BenchmarkPostChargesMemoryFresh(b *testing.B)    { benchmarkCharges(b, lab.StoreMemory, true) }
