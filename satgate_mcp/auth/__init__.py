"""Who is calling: bearer extraction, authenticators for each auth mode, revocation."""
