package analytics

import "fmt"

// The rules mirror the daemon's: a message it would reject with 400 makes
// the whole batch fail, so it must never reach the queue.

func invalid(typ, format string, args ...interface{}) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidMessage, typ, fmt.Sprintf(format, args...))
}

func needIdentity(typ, userID, anonymousID string) error {
	if userID == "" && anonymousID == "" {
		return invalid(typ, "UserId or AnonymousId is required")
	}
	return nil
}

func validateIdentify(m *Identify) error {
	return needIdentity("identify", m.UserId, m.AnonymousId)
}

func validateTrack(m *Track) error {
	if m.Event == "" {
		return invalid("track", "Event is required")
	}
	return needIdentity("track", m.UserId, m.AnonymousId)
}

func validatePage(m *Page) error {
	return needIdentity("page", m.UserId, m.AnonymousId)
}

func validateGroup(m *Group) error {
	if m.GroupId == "" {
		return invalid("group", "GroupId is required")
	}
	return needIdentity("group", m.UserId, m.AnonymousId)
}

func validateAlias(m *Alias) error {
	if m.UserId == "" {
		return invalid("alias", "UserId is required")
	}
	if m.PreviousId == "" {
		return invalid("alias", "PreviousId is required")
	}
	return nil
}
