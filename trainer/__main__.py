from trainer.launch import main

main()
