// Package analytics is the Go client for efd, the event-forwarding daemon.
//
// It keeps the API of the deprecated segmentio analytics-go v2 library, so a
// v2 program compiles unchanged once its import path points here:
//
//	client := analytics.New("wk_live_123")
//	client.Endpoint = "http://localhost:8088"
//	client.Size = 1 // flush every message, as in v2
//	defer client.Close()
//
//	err := client.Track(&analytics.Track{
//		UserId: "user-1",
//		Event:  "Order Completed",
//		Properties: map[string]interface{}{"revenue": 42.5},
//	})
//
// Calls validate the message, encode it and put it on a bounded in-memory
// queue; they do not wait on the network, except for room in a full queue
// while the daemon is draining it. Background goroutines send the queue to
// POST {Endpoint}/v1/batch: a flush starts at FlushAt messages (or after
// FlushAfter) and a request carries everything queued, up to 2,500 messages
// and 500 KiB, retrying network errors, 429 and 5xx with backoff and jitter.
// Close sends everything still queued and waits, up to CloseTimeout, for it;
// its error reports messages not delivered and calls refused.
//
// Configure a Client by setting its fields after New and before the first
// call; the first call (or Close) freezes the configuration.
package analytics
