package analytics

import "errors"

// Errors returned by the client; test for them with errors.Is.
var (
	// ErrInvalidMessage wraps every validation failure of a call.
	ErrInvalidMessage = errors.New("analytics: invalid message")
	// ErrMessageTooLarge is returned for a message over MaxMessageBytes.
	ErrMessageTooLarge = errors.New("analytics: message too large")
	// ErrQueueFull is returned when MaxQueueSize messages or MaxQueueBytes
	// bytes are already held.
	ErrQueueFull = errors.New("analytics: queue full, message dropped")
	// ErrClosed is returned by calls made after Close.
	ErrClosed = errors.New("analytics: client is closed")
	// ErrNotDelivered is wrapped by Close when messages were accepted but
	// never acknowledged by the server.
	ErrNotDelivered = errors.New("analytics: messages not delivered")
)
