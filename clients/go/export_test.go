package ticketing

// Written is how many request lines c has written over all its
// connections (tests only).
func Written(c *Client) uint64 { return c.sent.Load() }
