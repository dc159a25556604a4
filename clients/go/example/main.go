// Command example sends one message of each type to an efd daemon.
//
//	EFD_ENDPOINT=http://localhost:8088 EFD_WRITE_KEY=wk_live_123 go run ./example
//
// It exits non-zero if any call or Close fails, so scripts can rely on it.
package main

import (
	"errors"
	"fmt"
	"os"

	analytics "github.com/efd-dev/efd/clients/go"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
	fmt.Println("example: 5 messages delivered")
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() error {
	client := analytics.New(getenv("EFD_WRITE_KEY", "wk_live_123"))
	client.Endpoint = getenv("EFD_ENDPOINT", "http://localhost:8088")

	errs := []error{
		client.Identify(&analytics.Identify{
			UserId: "go-user-1",
			Traits: map[string]interface{}{"name": "Ada", "plan": "pro"},
		}),
		client.Track(&analytics.Track{
			UserId:     "go-user-1",
			Event:      "Order Completed",
			Properties: map[string]interface{}{"revenue": 42.5},
		}),
		client.Page(&analytics.Page{
			UserId: "go-user-1",
			Name:   "Home",
			Traits: map[string]interface{}{"url": "https://example.com/", "title": "Home"},
		}),
		client.Group(&analytics.Group{
			UserId:  "go-user-1",
			GroupId: "g-1",
			Traits:  map[string]interface{}{"name": "Acme"},
		}),
		client.Alias(&analytics.Alias{
			UserId:     "go-user-1",
			PreviousId: "anon-1",
		}),
	}
	// Close even when a call failed, so what was queued is still sent.
	errs = append(errs, client.Close())
	return errors.Join(errs...)
}
