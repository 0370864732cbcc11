from konduit.cli import main

main()
