"""Cloud sync: the CloudStore boundary and page upload/download (arrives with the sync issue)."""
