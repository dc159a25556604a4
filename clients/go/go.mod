module github.com/efd-dev/efd/clients/go

go 1.23
