module ssync-go-sender

go 1.19
