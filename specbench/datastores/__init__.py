"""Token databases that drafters read: n-gram pools and a suffix-array datastore. Pure and testable."""
