"""Reading run files and everything computed from them; never imports drivers."""
