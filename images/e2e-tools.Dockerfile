# havip-e2e-tools: the kind suite's client and responders (`e2e-tool probe|respond`).
FROM scratch
COPY e2e-tool /e2e-tool
ENTRYPOINT ["/e2e-tool"]
