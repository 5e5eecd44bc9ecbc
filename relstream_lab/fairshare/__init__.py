"""Fair share between queries: `relstream-lab bench fairshare`."""
